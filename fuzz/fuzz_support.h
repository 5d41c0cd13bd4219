#pragma once
// Helpers shared by the libFuzzer targets (docs/fuzzing.md): the property check that crashes the
// fuzzer, the bundled model's location, and a private scratch directory for the parsers that read
// files. Header-only; every target is its own process, one input at a time.

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

// A property of the code under test does not hold: report it and crash, so libFuzzer saves the
// input. (A Status error is never a failure: bad input is supposed to be refused.)
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                                  \
    }                                                                                    \
  } while (0)

namespace tandem::fuzz {

// The bundled model (models/target): tokenizer.json, tokenizer_config.json, config.json.
// TANDEM_FUZZ_MODEL_DIR in the environment overrides the path compiled in.
inline std::string ModelDir() {
  const char* env = std::getenv("TANDEM_FUZZ_MODEL_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(TANDEM_FUZZ_MODEL_DIR);
}

// A directory of this process's own (in /dev/shm when there is one), removed at exit. Targets
// write the fuzzer's bytes there for the loaders that only read files.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::string tmpl = std::filesystem::is_directory("/dev/shm") ? "/dev/shm/tandem-fuzz-XXXXXX"
                                                                 : "/tmp/tandem-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    static std::string to_remove;
    to_remove = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(to_remove, ec);
    });
    return tmpl;
  }();
  return dir;
}

inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
}

// Well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
inline bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

}  // namespace tandem::fuzz
