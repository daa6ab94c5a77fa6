/* The firmware's only ways out: two UARTs and a reset. No semihosting: the host runner (QEMU) gives
 * the firmware its inputs in RAM and takes its outputs from a UART, so firmware built from an
 * untrusted model can neither run a host command (SYS_SYSTEM) nor open a host file (SYS_OPEN).
 *
 *   inputs   the runner loads rlx_in.bin at rlx_inbox + 4 and its length at rlx_inbox
 *            (QEMU -device loader; the address is in rlx_link.ld)
 *   outputs  UART0 (CMSDK APB UART, 0x40004000): the raw bytes of rlx_out.bin, nothing else
 *   console  UART1 (0x40005000): text lines; the last ones are "rlx: stack <bytes>" and
 *            "rlx: exit <status>" (0 = success)
 *   exit     SYSRESETREQ; QEMU runs with -no-reboot, so a reset request ends it */
#ifndef RLX_HOSTIO_H
#define RLX_HOSTIO_H
#include "rlx_types.h"

/* Inbox: a uint32 byte count, then the bytes of rlx_in.bin. */
extern const volatile uint32_t rlx_inbox[];
void rlx_io_init(void);
void rlx_out_write(const void *buf, uint32_t n);
void rlx_console_puts(const char *s);
void rlx_console_u32(uint32_t v);
/* Print "rlx: exit <code>" on the console and end the run. */
__attribute__((noreturn)) void rlx_exit(int32_t code);

/* Deepest stack use so far, in bytes (the startup code paints the stack). */
uint32_t rlx_stack_peak_bytes(void);
#endif
