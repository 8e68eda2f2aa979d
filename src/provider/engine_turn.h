// The engine's turn, as the provider sees it. Methods whose names end in `_st` are the engine's
// side of a shared object and may run only on a thread that holds the engine's turn
// (Engine::mutex_; docs/ARCHITECTURE.md, "src/provider in detail"). The engine marks its turns
// with an EngineTurnMark; in builds with assertions (the sanitizer builds) every `_st` method
// asserts that its thread holds one. Without assertions both compile to nothing.
#pragma once

#include <cassert>

namespace urdma::provider {

#ifndef NDEBUG
// Turns this thread holds (nested: a command the turn runs may take it again).
inline thread_local int t_engine_turns = 0;

class EngineTurnMark {
 public:
  EngineTurnMark() { ++t_engine_turns; }
  ~EngineTurnMark() { --t_engine_turns; }
  EngineTurnMark(const EngineTurnMark&) = delete;
  EngineTurnMark& operator=(const EngineTurnMark&) = delete;
};

inline bool in_engine_turn() { return t_engine_turns > 0; }
#else
class [[maybe_unused]] EngineTurnMark {};
inline bool in_engine_turn() { return true; }
#endif

}  // namespace urdma::provider

// In an `_st` method: its thread must hold the engine's turn.
#define URDMA_ASSERT_ENGINE_TURN() \
  assert(::urdma::provider::in_engine_turn() && "an _st method called outside the engine's turn")
