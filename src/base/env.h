// Numeric settings from the environment, read one way by every layer that has them (the verbs
// layer's engine settings, net's URDMA_UDP_GSO/URDMA_UDP_GRO).
#pragma once

#include <cstdint>
#include <string>

namespace urdma::base {

// Reads `name` as a decimal number in lo..hi into *value. Unset or empty leaves *value alone and
// returns 0; anything else (a sign, trailing characters, out of range) returns EINVAL with
// "NAME=VALUE is not a number in LO..HI" in *why.
int env_number(const char* name, uint64_t lo, uint64_t hi, uint64_t* value, std::string* why);

}  // namespace urdma::base
