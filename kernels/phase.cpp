// PhaseScope (see phase.h).
#include "kernels/phase.h"

#include <utility>

namespace reel {
namespace {

thread_local std::string current;

}  // namespace

PhaseScope::PhaseScope(std::string label) : previous_(std::exchange(current, std::move(label))) {}

PhaseScope::~PhaseScope() { current = std::move(previous_); }

const std::string& current_phase() { return current; }

}  // namespace reel
