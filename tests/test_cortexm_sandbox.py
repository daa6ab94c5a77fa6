"""The Cortex-M firmware runner gives the firmware nothing of the host beyond its inputs and outputs.

The generated model code is compiled from an untrusted model file; even if a name ever slipped
into it as code, the firmware must not be able to run a host command (semihosting SYS_SYSTEM) or
read or write a host file (SYS_OPEN of any path). The firmware below tries both from
``rlx_model_run`` and the test checks that nothing happened on the host. Needs arm-none-eabi-gcc and
qemu-system-arm (the CI installs them; without them the test FAILS, as tests/test_cortexm.py does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rlx_cortexm import firmware
from rlx_cortexm.targets import missing_reason, target

# Semihosting from the model's own code: SYS_SYSTEM (0x12) "touch <marker>", then SYS_OPEN (0x01) of
# a host file outside the run directory, SYS_READ (0x06) of its bytes into the output tensor. The
# output is 16 bytes of the arena; the input table is empty.
EVIL_MODEL = r"""
#include "rlx_kernels.h"
#include "rlx_model.h"
uint8_t rlx_arena[RLX_ARENA_BYTES] __attribute__((aligned(64), section(".bss.rlx_arena")));
const rlx_io_t rlx_model_inputs[] = {{0, 0u}};
const uint32_t rlx_model_num_inputs = 0u;
const rlx_io_t rlx_model_outputs[] = {{rlx_arena, 16u}};
const uint32_t rlx_model_num_outputs = 1u;

static int32_t sh(int32_t op, const void *arg)
{
    register int32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

static uint32_t len(const char *s) { uint32_t n = 0; while (s[n]) n++; return n; }

void rlx_model_run(void)
{
    static const char cmd[] = "touch @MARKER@";
    static const char path[] = "@SECRET@";
    uint32_t sys[2] = {(uint32_t)cmd, len(cmd)};
    sh(0x12, sys);
    uint32_t op[3] = {(uint32_t)path, 1u, len(path)};
    int32_t h = sh(0x01, op);
    if (h >= 0) {
        uint32_t rd[3] = {(uint32_t)h, (uint32_t)rlx_arena, 16u};
        sh(0x06, rd);
    }
}
"""
MODEL_H = """#ifndef RLX_MODEL_H
#define RLX_MODEL_H
#include "rlx_io.h"
#define RLX_ARENA_BYTES 64u
extern uint8_t rlx_arena[RLX_ARENA_BYTES];
#endif
"""
SECRET = b"TOP-SECRET-HOST!"  # 16 bytes, the size of the output


@pytest.fixture
def toolchain() -> None:
    why = missing_reason()
    if why:
        pytest.fail(f"rlx-cortexm cannot build or run firmware: {why}", pytrace=False)


def test_firmware_cannot_run_host_commands_or_open_host_files(toolchain: None, tmp_path: Path) -> None:
    marker = tmp_path / "RLX_PWNED"
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    src = EVIL_MODEL.replace("@MARKER@", str(marker)).replace("@SECRET@", str(secret))
    t = target("m4")
    fw = firmware.build({"rlx_model.c": src, "rlx_model.h": MODEL_H}, t, 64)
    out = b""
    try:
        out = firmware.run(fw, t, b"", timeout=60).output
    except firmware.FirmwareError as e:
        # Refusing to run the call (the firmware faults) is fine: the host must be untouched.
        assert "fault" in str(e).lower(), e
    assert not marker.exists(), "the firmware ran a host command through semihosting SYS_SYSTEM"
    assert SECRET not in out, "the firmware read a host file through semihosting SYS_OPEN"
    assert not list(tmp_path.glob("rlx_*")), "the firmware wrote into a host directory"


def test_qemu_command_has_no_semihosting_no_network_and_a_sandbox() -> None:
    cmd = " ".join(firmware.qemu_command(target("m4"), "firmware.elf", in_bytes=4))
    assert "semihosting" not in cmd
    assert "-nic none" in cmd and "-no-reboot" in cmd
    assert "spawn=deny" in cmd or "-sandbox" not in cmd  # the sandbox is added when QEMU has it
