/* ARM semihosting (bkpt 0xAB): file I/O and exit through the debugger or QEMU -semihosting. */
#ifndef RLX_SEMIHOST_H
#define RLX_SEMIHOST_H
#include "rlx_types.h"
#define RLX_SH_MODE_RB 1
#define RLX_SH_MODE_WB 5
int32_t rlx_sh_open(const char *path, int32_t mode);
int32_t rlx_sh_close(int32_t handle);
/* Both return the number of bytes NOT transferred (0 on success). */
int32_t rlx_sh_read(int32_t handle, void *buf, uint32_t n);
int32_t rlx_sh_write(int32_t handle, const void *buf, uint32_t n);
void rlx_sh_puts(const char *s);
__attribute__((noreturn)) void rlx_sh_exit(int32_t code);

/* Deepest stack use so far, in bytes (the startup code paints the stack). */
uint32_t rlx_stack_peak_bytes(void);
#endif
