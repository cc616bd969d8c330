// `reel train --log` (see metrics_log.h).
#include "tools/metrics_log.h"

#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tensor/error.h"

namespace reel::tools {

namespace {

// SIGPIPE ignored for a scope (and its previous disposition put back on any exit).
class IgnoredSigpipe {
 public:
  IgnoredSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &previous_);
  }
  ~IgnoredSigpipe() { sigaction(SIGPIPE, &previous_, nullptr); }
  IgnoredSigpipe(const IgnoredSigpipe&) = delete;
  IgnoredSigpipe& operator=(const IgnoredSigpipe&) = delete;

 private:
  struct sigaction previous_ {};
};

// The picture's path: FILE.jsonl -> FILE.png (any other name: FILE.png appended).
std::string png_path(const std::string& log) {
  std::filesystem::path p(log);
  if (p.extension() == ".jsonl" || p.extension() == ".json") p.replace_extension(".png");
  else p += ".png";
  return p.string();
}

// JSON has no NaN or infinity: a step whose loss overflowed is logged as null, and skipped when drawn.
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// gnuplot's string literal (single quotes, a quote doubled).
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  REEL_CHECK(file_ != nullptr, "train: --log ", path, ": cannot open it for writing");
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write_line(const std::string& line) {
  if (!file_) return;
  // One write per line, flushed: a reader (or a crash) sees whole lines only up to the last.
  const std::string out = line + "\n";
  REEL_CHECK(std::fwrite(out.data(), 1, out.size(), file_) == out.size() && std::fflush(file_) == 0,
             "train: --log ", path_, ": writing failed (disk full?)");
}

void MetricsLog::step(const Step& s) {
  if (!file_) return;
  nlohmann::json j{{"step", s.step},      {"loss", number(s.loss)},
                   {"lr", number(s.lr)},  {"grad_norm", number(s.grad_norm)},
                   {"scale", number(s.scale)}, {"stepped", s.stepped},
                   {"items_per_s", number(s.items_per_s)}, {"peak_mib", number(s.peak_mib)}};
  write_line(j.dump());
}

void MetricsLog::eval(int64_t step, const char* name, double value) {
  if (!file_) return;
  write_line(nlohmann::json{{"step", step}, {"eval", name}, {"value", number(value)}}.dump());
}

std::string MetricsLog::plot(const std::string& title) {
  if (!file_) return "";
  std::fflush(file_);
  // The whole file: a resumed run's earlier steps too.
  std::vector<std::pair<int64_t, double>> losses, evals;
  std::string eval_name;
  std::ifstream in(path_);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step")) continue;  // a partial last line of a stopped run
    if (j.contains("eval") && j["value"].is_number()) {
      eval_name = j["eval"].get<std::string>();
      evals.push_back({j["step"].get<int64_t>(), j["value"].get<double>()});
    } else if (j.contains("loss") && j["loss"].is_number()) {
      losses.push_back({j["step"].get<int64_t>(), j["loss"].get<double>()});
    }
  }
  if (losses.empty()) return "";
  const std::string png = png_path(path_);
  std::filesystem::path dat = std::filesystem::path(png).replace_extension(".dat");
  std::filesystem::path eval_dat = std::filesystem::path(png).replace_extension(".eval.dat");
  {
    std::ofstream d(dat);
    d << "# step loss (from " << path_ << ")\n";
    for (const auto& [s, v] : losses) d << s << " " << v << "\n";
    std::ofstream e(eval_dat);
    e << "# step " << (eval_name.empty() ? "eval" : eval_name) << "\n";
    for (const auto& [s, v] : evals) e << s << " " << v << "\n";
  }
  const bool accuracy = eval_name.find("accuracy") != std::string::npos;
  std::string script = "set terminal pngcairo size 960,560 font 'Sans,11' noenhanced\n";
  // Drawn to a temporary name and renamed, so a picture is whole or absent.
  const std::string tmp = png + ".tmp";
  script += "set output " + quoted(tmp) + "\n";
  script += "set title " + quoted(title) + "\n";
  script += "set xlabel 'optimizer step'\nset ylabel " +
            quoted(accuracy || evals.empty() ? "training loss (mean over the step)" : "loss") + "\n";
  // The key above the plot, clear of the curves; a loss is never negative; a little room at the
  // right, so the last evaluation is not drawn on the frame.
  script += "set grid\nset key outside top center horizontal\nset yrange [0:*]\nset xrange [0:*]\n";
  script += "set offsets 0, graph 0.02, graph 0.05, 0\n";
  std::string plots = quoted(dat.string()) + " using 1:2 with lines lw 1.5 title 'training loss'";
  if (!evals.empty()) {
    const std::string label = accuracy ? "test accuracy (%)" : eval_name == "validation_loss" ? "validation loss" : eval_name;
    if (accuracy) {
      script += "set y2label " + quoted(label) + "\nset y2tics\nset ytics nomirror\n";
      plots += ", " + quoted(eval_dat.string()) + " using 1:($2*100) axes x1y2 with linespoints pt 7 title " + quoted(label);
    } else {
      plots += ", " + quoted(eval_dat.string()) + " using 1:2 with points pt 7 ps 1.5 title " + quoted(label);
    }
  }
  script += "plot " + plots + "\n";
  // Where gnuplot is missing (or stops early) the shell exits before reading the script, and writing
  // into a pipe nobody reads raises SIGPIPE, which would end the run here, after its training: the
  // signal is ignored while the pipe is open, so the write fails instead and the run says so.
  const IgnoredSigpipe ignored;
  std::FILE* gp = popen("gnuplot 2>&1", "w");
  if (!gp) {
    std::fprintf(stderr, "train: --log: gnuplot could not be started; the picture is not drawn (%s has the data)\n",
                 dat.string().c_str());
    return "";
  }
  const bool written = std::fwrite(script.data(), 1, script.size(), gp) == script.size();
  std::error_code ec;
  if (pclose(gp) != 0 || !written || !std::filesystem::exists(tmp) || (std::filesystem::rename(tmp, png, ec), ec)) {
    std::filesystem::remove(tmp, ec);
    std::fprintf(stderr, "train: --log: gnuplot failed; the picture is not drawn (%s has the data)\n",
                 dat.string().c_str());
    return "";
  }
  return png;
}

}  // namespace reel::tools
