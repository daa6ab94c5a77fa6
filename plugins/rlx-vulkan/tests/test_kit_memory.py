"""The device kit's Vulkan memory kinds (:mod:`rlx_core.plugin.vulkan`), which rlx-vulkan's
``RLX_VULKAN_MEMORY`` picks: the memory-type choice of each kind (against made-up memory types
shaped like a discrete GPU's, so the choice is checked without one), device-local buffers written
and read through staging on the Vulkan device here (lavapipe in CI), and what a wrong kind says. A
missing Vulkan device FAILS (it does not skip)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rlx_core.errors import PluginError
from rlx_core.plugin import vulkan as kit


@pytest.fixture(scope="module")
def ctx() -> Any:
    from rlx_vulkan import plugin

    dev = plugin.rlx_probe_devices()[0]
    if not dev.available:
        pytest.fail(f"no usable Vulkan device: {dev.reason} (apt-get install libvulkan1 mesa-vulkan-drivers "
                    "glslang-tools)")
    return kit.context()


def _fake(vk: Any, *flags: int) -> Any:
    """A context whose device offers memory types of ``flags``, in that order."""
    types = [SimpleNamespace(propertyFlags=f) for f in flags]
    return SimpleNamespace(vk=vk, mem_props=SimpleNamespace(memoryTypeCount=len(types), memoryTypes=types))


def test_memory_type_choice_per_kind(ctx: Any) -> None:
    """Device memory takes plain VRAM before the BAR window (device-local + host-visible) and either
    before system memory; staging takes host-cached before write-combined; host takes the first
    host-visible coherent type. Types the buffer does not allow are never taken."""
    vk = ctx.vk
    dl, hv = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
    hc, cached = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
    # a discrete GPU: system memory (write-combined), system memory (cached), BAR, VRAM
    gpu = _fake(vk, hv | hc, hv | hc | cached, dl | hv | hc, dl)
    mem_type = kit.Context._mem_type
    (store, device), (store2, host), (xfer, staging) = (kit.memory_kind(vk, m)
                                                        for m in (kit.DEVICE, kit.HOST, kit.STAGING))
    assert store == store2 and store & vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
    assert not xfer & vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT  # staging is only copied from and to
    assert mem_type(gpu, 0b1111, device) == 3
    assert mem_type(gpu, 0b0111, device) == 2  # no plain VRAM allowed: the BAR window
    assert mem_type(gpu, 0b0011, device) == 0  # no device-local type at all: anything
    assert mem_type(gpu, 0b1111, staging) == 1
    assert mem_type(gpu, 0b1101, staging) == 0
    assert mem_type(gpu, 0b1111, host) == 0
    with pytest.raises(RuntimeError, match="no Vulkan memory type fits"):
        mem_type(gpu, 0b1000, host)


@pytest.mark.parametrize("memory", [kit.HOST, kit.DEVICE])
def test_buffer_round_trip(ctx: Any, memory: str) -> None:
    """Writes at offsets (queued and uploaded in one transfer for device memory) read back exactly,
    also after a later overwrite."""
    alloc = kit.VkAllocator(ctx, memory)
    buf = alloc.alloc(1000)
    assert buf.memory == memory and buf.nbytes == 1000
    rng = np.random.default_rng(3)
    a = rng.standard_normal(50).astype(np.float32)
    b = rng.integers(-9, 9, 30).astype(np.int64)
    alloc.copyin(buf, 0, a)
    alloc.copyin(buf, 512, b)
    np.testing.assert_array_equal(alloc.copyout(buf, 0, a.nbytes).view(np.float32), a)
    np.testing.assert_array_equal(alloc.copyout(buf, 512, b.nbytes).view(np.int64), b)
    alloc.copyin(buf, 4, np.array([7.5], np.float32))
    assert alloc.copyout(buf, 0, 8).view(np.float32).tolist() == [a[0], 7.5]
    assert alloc.copyout(buf, 0, 0).size == 0
    assert not buf.pending


def test_mapping_per_kind(ctx: Any) -> None:
    """Host and staging buffers are mapped; a device-local one is not, and says so."""
    assert ctx.buffer(64, kit.HOST).mapping().size == 64
    assert ctx.buffer(64, kit.STAGING).mapping().size == 64
    dev = ctx.buffer(64, kit.DEVICE)
    assert dev.host is None
    with pytest.raises(PluginError, match="no host mapping"):
        dev.mapping()


def test_unknown_memory_kind_or_timestamps_fail(ctx: Any) -> None:
    with pytest.raises(PluginError, match="unknown Vulkan memory kind 'vram'"):
        ctx.buffer(16, "vram")
    with pytest.raises(PluginError, match="unknown Vulkan memory kind 'vram'"):
        kit.VkRuntime(ctx, kit.SpirvCompiler("glsl", "x", "x", (), src_suffix=".comp", where="x", fix="x"),
                      lambda launches: (np.zeros(0, np.int32), []), memory="vram")
    with pytest.raises(PluginError, match="unknown Vulkan memory kind 'staging'"):
        kit.VkAllocator(ctx, kit.STAGING)  # a transfer buffer, not a place for a program's buffers
    with pytest.raises(PluginError, match="unknown Vulkan timestamps setting 'all'"):
        kit.VkRuntime(ctx, kit.SpirvCompiler("glsl", "x", "x", (), src_suffix=".comp", where="x", fix="x"),
                      lambda launches: (np.zeros(0, np.int32), []), timestamps="all")
