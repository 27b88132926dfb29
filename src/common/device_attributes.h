// Per-device facts and settings the host side looks up once per device and process: the SM count,
// and the dynamic shared-memory opt-in of a kernel (cudaFuncSetAttribute is per device and costs a
// driver call, so it is made once; racing threads at worst both make it, which is harmless).
#pragma once

namespace hmla::detail {

int current_device_sm_count();

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once.
void set_max_dynamic_smem_once(const void* kernel, int bytes);

}  // namespace hmla::detail
