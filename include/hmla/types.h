// hmla public types: element types and the error classes every entry point throws.
//
// Error policy (one for the whole library): invalid arguments throw hmla::InvalidArgument, a
// std::invalid_argument whose message names the entry point, the argument, the value received and
// the value expected. Failures reported by the CUDA runtime throw hmla::CudaError. Nothing is ever
// reported through a silent wrong answer or a device-side trap.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace hmla {

enum class DType : int32_t {
  kBF16 = 0,
  kFP16 = 1,
};

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
  }
  return "unknown";
}

class InvalidArgument : public std::invalid_argument {
 public:
  InvalidArgument(const std::string& where, const std::string& argument, const std::string& got,
                  const std::string& expected)
      : std::invalid_argument(where + ": argument '" + argument + "' is " + got + ", expected " +
                              expected),
        argument_(argument) {}
  const std::string& argument() const { return argument_; }

 private:
  std::string argument_;
};

class CudaError : public std::runtime_error {
 public:
  explicit CudaError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace hmla
