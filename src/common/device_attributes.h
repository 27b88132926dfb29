// Per-device facts and settings the host side looks up once per device and process: the SM count,
// and the dynamic shared-memory opt-in of a kernel (cudaFuncSetAttribute is per device and costs a
// driver call, so it is made once, to the device's largest opt-in; racing threads at worst both
// make it, which is harmless).
#pragma once

namespace hmla::detail {

int current_device_sm_count();

// Raises `kernel`'s dynamic shared-memory limit on the current device, once, so that launches of up to
// the device's opt-in limit work; throws CudaError when `bytes` exceeds that limit.
void set_max_dynamic_smem_once(const void* kernel, int bytes);

}  // namespace hmla::detail
