// test_seal_manifest FILE: rewrites FILE (a manifest.json body: a JSON object written with a line
// break after its '{', without a manifest_xxh3 line) as seal_manifest makes it, so a test can
// change a field and still reach the check of that field behind the manifest's checksum.
// Exit 0 when written, 2 on a bad input.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "checkpoint/owner_checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: test_seal_manifest FILE\n");
    return 2;
  }
  std::stringstream ss;
  ss << std::ifstream(argv[1], std::ios::binary).rdbuf();
  try {
    const std::string sealed = mfsdp::seal_manifest(ss.str());
    std::ofstream(argv[1], std::ios::binary | std::ios::trunc) << sealed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_seal_manifest: %s: %s\n", argv[1], e.what());
    return 2;
  }
  return 0;
}
