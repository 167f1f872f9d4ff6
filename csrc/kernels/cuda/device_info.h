// The device facts every op's launch rule reads (the torch glue fills them
// from the device's properties): kept apart from any one op's plan.
#pragma once

namespace fln::cuda {

struct DeviceInfo {
  int index = 0;
  int sm_count = 1;
  int cc_major = 8;
};

}  // namespace fln::cuda
