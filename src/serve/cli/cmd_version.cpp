// `locus version`: build facts (which backends were compiled in).
#include <iostream>

#include "serve/cli/command.h"

LOCUS_REGISTER_COMMAND("version", "print the version and the backends built in", [](CLI::App&) {
  return [] {
    std::cout << "locus 0.1.0 (backends: cpu"
#if defined(LOCUS_WITH_CUDA)
              << ", cuda"
#endif
              << ")\n";
    return 0;
  };
});
