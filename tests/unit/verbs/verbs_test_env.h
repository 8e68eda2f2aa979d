// Shared by the verbs tests: why the fresh network namespace could not be made (empty: it was).
#pragma once

#include <string>

namespace urdma::verbs_test {

std::string& netns_failure();

}  // namespace urdma::verbs_test
