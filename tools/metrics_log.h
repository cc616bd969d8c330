// `reel train --log FILE.jsonl`: one JSON line per optimizer step and per evaluation, written as the
// run goes (a line at a time, flushed, so a run stopped by a crash keeps every finished step), and at
// the end a picture of it, FILE.png (FILE without its .jsonl), drawn by gnuplot (the build installs
// gnuplot-nox): the training loss against the step, the evaluations on a second axis (validation
// loss for text models, test accuracy for image models).
//
//   {"step": 12, "loss": 2.41, "lr": 0.0019, "grad_norm": 0.83, "scale": 1, "stepped": true,
//    "items_per_s": 51234, "peak_mib": 210.4}
//   {"step": 200, "eval": "validation_loss", "value": 1.93}
//
// A resumed run (--resume) appends to the file; the picture is drawn from the whole file, so it
// shows the run from its first step.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace reel::tools {

class MetricsLog {
 public:
  // An empty path: nothing is written. `append`: keep the lines already there (a resumed run).
  MetricsLog(const std::string& path, bool append);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  bool enabled() const { return file_ != nullptr; }
  struct Step {
    int64_t step;
    double loss, lr, grad_norm, scale;
    bool stepped;  // false: the update was skipped (a non-finite gradient)
    double items_per_s, peak_mib;
  };
  void step(const Step& s);
  // `name`: "validation_loss", "test_accuracy", ...
  void eval(int64_t step, const char* name, double value);
  // Draws the picture from the whole file (see the top); returns its path, or "" with the reason on
  // stderr when gnuplot is missing or failed.
  std::string plot(const std::string& title);

 private:
  void write_line(const std::string& line);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace reel::tools
