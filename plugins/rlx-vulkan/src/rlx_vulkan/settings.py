"""rlx-vulkan's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-vulkan"

TILED = declare_setting(
    "RLX_VULKAN_TILED", "bool", False,
    "Use the tiled (GPU) kernels on a CPU Vulkan device too, e.g. to test them on lavapipe.", owner=OWNER)

GEMM = declare_setting(
    "RLX_VULKAN_GEMM", "choice", "auto",
    "GPU matmul/linear kernel: auto (register-blocked tiles, 128x128 where that fills the device, else "
    "64x64), large (128x128), medium (128x64), small (64x64), or basic (the shared 16x16-tile kernel, and "
    "softmax/layer_norm/reductions one invocation per row). CPU devices always run the untiled kernels.",
    owner=OWNER, choices=("auto", "large", "medium", "small", "basic"))

MEMORY = declare_setting(
    "RLX_VULKAN_MEMORY", "choice", "device",
    "Where a program's arena, constants and launch parameters live: device (device-local memory; inputs "
    "and outputs go through a host staging buffer copied by the program's command buffer) or host "
    "(host-visible mapped memory that shaders read across the bus on a discrete GPU).",
    owner=OWNER, choices=("device", "host"))

ATTENTION = declare_setting(
    "RLX_VULKAN_ATTENTION", "choice", "fused",
    "GPU attention: fused (one kernel per attention op: scores, mask, softmax and the product with v "
    "without writing the scores to memory) or off (the core's decomposition: matmul, softmax, matmul). "
    "CPU devices and RLX_VULKAN_GEMM=basic always decompose.", owner=OWNER, choices=("fused", "off"))

PROFILE = declare_setting(
    "RLX_VULKAN_PROFILE", "bool", False,
    "Record a timestamp after every dispatch (device memory only), so VulkanProgram.kernel_seconds() "
    "reports the last run's device time per kernel; costs a little device time per dispatch.", owner=OWNER)

EPILOGUES = declare_setting(
    "RLX_VULKAN_EPILOGUES", "bool", True,
    "GPU linears store straight into a following head-split transpose's layout, add a following "
    "residual and apply a following elementwise program (GELU) as they store (those steps then launch "
    "nothing); 0 runs every step as its own kernel.",
    owner=OWNER)

SETTINGS: list[Setting] = [TILED, GEMM, MEMORY, ATTENTION, PROFILE, EPILOGUES]
