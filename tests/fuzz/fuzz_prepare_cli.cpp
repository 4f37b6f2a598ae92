// libFuzzer target: mfsdp-prepare's command line (apps/mfsdp_prepare.cpp's main, built with
// -Dmain=prepare_main): the input is the argument list, separated by NUL bytes. It runs in a
// scratch directory holding a.txt and b.jsonl; '/' in an argument becomes '_', so every path stays
// inside it (inputs, outputs of earlier runs, the directory itself). --threads is left out (a
// thousand threads per run only measures the machine). Exit codes are the tool's business; a
// crash, a sanitizer report or a hang is a bug.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

int prepare_main(int argc, char** argv);

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::filesystem::path dir = "/tmp/mfsdp_fuzz_prepare_cli_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::current_path(dir);
  std::ofstream("a.txt") << "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n";
  std::ofstream("b.jsonl") << "{\"text\": \"one doc\"}\n{\"text\": \"two \\u00e9\", \"body\": \"x\"}\n";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"mfsdp-prepare"};
  std::string cur;
  for (size_t i = 0; i <= size; ++i) {
    if (i == size || data[i] == 0) {
      args.push_back(cur);
      cur.clear();
      if (args.size() > 24) break;
    } else {
      cur += data[i] == '/' ? '_' : static_cast<char>(data[i]);
    }
  }
  for (const auto& a : args)
    if (a.rfind("--threads", 0) == 0) return 0;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  (void)prepare_main(static_cast<int>(args.size()), argv.data());
  return 0;
}
