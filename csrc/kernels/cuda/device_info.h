// The device facts every op's launch rule reads (the torch glue fills them
// from the device's properties): kept apart from any one op's plan.
#pragma once
#include <cstdint>

namespace fln::cuda {

struct DeviceInfo {
  int index = 0;
  int sm_count = 1;
  int cc_major = 8;
  int64_t dram_bytes_per_us = 0;  // peak DRAM bandwidth (2 x memory clock x bus width); 0: unknown
};

}  // namespace fln::cuda
