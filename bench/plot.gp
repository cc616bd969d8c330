# Items/s per model and precision, reel beside each PyTorch configuration, from bench/join.py's
# joined.dat:   gnuplot -e "dat='bench-out/joined.dat'; out='bench/throughput.png'" bench/plot.gp
if (!exists("dat")) dat = 'bench-out/joined.dat'
if (!exists("out")) out = 'bench/throughput.png'
set terminal pngcairo size 1200,600 noenhanced
set output out
set title "Training-step throughput (items/s, higher is better; log scale)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set datafile missing "-"
set logscale y
set ylabel "items/s"
set xtics rotate by -30
set key outside right top
set grid ytics
ncols = int(system("awk 'NR==1 {print NF}' ".dat))
set key autotitle columnheader
plot for [c=2:ncols] dat using c:xtic(1)
