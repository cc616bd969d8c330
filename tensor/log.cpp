// Logging by topic (see log.h).
#include "tensor/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>

namespace reel {

namespace {

std::mutex mu;
std::set<std::string> topics;
bool loaded = false;

void load_locked() {
  topics.clear();
  const char* env = std::getenv("REEL_LOG");
  std::stringstream ss(env ? env : "");
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) topics.insert(t);
  loaded = true;
}

}  // namespace

void reload_log_topics() {
  std::lock_guard<std::mutex> lock(mu);
  load_locked();
}

bool log_enabled(const char* topic) {
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) load_locked();
  return topics.count("all") > 0 || topics.count(topic) > 0;
}

void log_line(const char* topic, const std::string& message) {
  if (!log_enabled(topic)) return;
  std::fprintf(stderr, "[reel:%s] %s\n", topic, message.c_str());
}

}  // namespace reel
