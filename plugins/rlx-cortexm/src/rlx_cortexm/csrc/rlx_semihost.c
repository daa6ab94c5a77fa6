#include "rlx_semihost.h"

static int32_t rlx_sh_call(int32_t op, const void *arg)
{
    register int32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

static uint32_t rlx_strlen(const char *s)
{
    uint32_t n = 0;
    while (s[n]) n++;
    return n;
}

int32_t rlx_sh_open(const char *path, int32_t mode)
{
    uint32_t args[3] = {(uint32_t)path, (uint32_t)mode, rlx_strlen(path)};
    return rlx_sh_call(0x01, args);
}

int32_t rlx_sh_close(int32_t handle)
{
    uint32_t args[1] = {(uint32_t)handle};
    return rlx_sh_call(0x02, args);
}

int32_t rlx_sh_read(int32_t handle, void *buf, uint32_t n)
{
    uint32_t args[3] = {(uint32_t)handle, (uint32_t)buf, n};
    return n ? rlx_sh_call(0x06, args) : 0;
}

int32_t rlx_sh_write(int32_t handle, const void *buf, uint32_t n)
{
    uint32_t args[3] = {(uint32_t)handle, (uint32_t)buf, n};
    return n ? rlx_sh_call(0x05, args) : 0;
}

void rlx_sh_puts(const char *s)
{
    rlx_sh_call(0x04, s);
}

void rlx_sh_exit(int32_t code)
{
    /* SYS_EXIT_EXTENDED with ADP_Stopped_ApplicationExit: the exit status reaches the host. The
     * block is static so that exiting works even with a broken stack pointer (a fault). */
    static uint32_t args[2];
    args[0] = 0x20026u;
    args[1] = (uint32_t)code;
    rlx_sh_call(0x20, args);
    for (;;) {
    }
}
