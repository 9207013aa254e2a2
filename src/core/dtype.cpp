#include "core/dtype.h"

#include "core/error.h"

namespace locus {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16: case DType::kFP16: return 2;
    case DType::kFP32: case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kFP8E4M3: case DType::kFP4E2M1x2: case DType::kU8: return 1;
  }
  LOCUS_THROW("dtype_size: invalid dtype ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kFP4E2M1x2: return "fp4_e2m1x2";
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
  }
  return "invalid";
}

DType dtype_from_name(std::string_view n) {
  for (DType t : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3, DType::kFP4E2M1x2,
                  DType::kU8, DType::kI32, DType::kI64}) {
    if (n == dtype_name(t)) return t;
  }
  if (n == "bfloat16") return DType::kBF16;
  if (n == "float16") return DType::kFP16;
  if (n == "float32") return DType::kFP32;
  LOCUS_THROW("unknown dtype '", n, "' (expected bf16, fp16, fp32, fp8_e4m3, fp4_e2m1x2, u8, i32, i64)");
}

DType dtype_from_safetensors(std::string_view n) {
  if (n == "BF16") return DType::kBF16;
  if (n == "F16") return DType::kFP16;
  if (n == "F32") return DType::kFP32;
  if (n == "F8_E4M3") return DType::kFP8E4M3;
  if (n == "U8") return DType::kU8;
  if (n == "I32") return DType::kI32;
  if (n == "I64") return DType::kI64;
  LOCUS_THROW("unsupported safetensors dtype '", n, "' (supported: BF16, F16, F32, F8_E4M3, U8, I32, I64)");
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::kBF16: return "BF16";
    case DType::kFP16: return "F16";
    case DType::kFP32: return "F32";
    case DType::kFP8E4M3: return "F8_E4M3";
    case DType::kFP4E2M1x2: case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "invalid";
}

std::string Device::name() const { return str(is_cpu() ? "cpu" : "cuda", ":", index); }

}  // namespace locus
