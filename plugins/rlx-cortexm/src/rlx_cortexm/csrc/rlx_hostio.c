#include "rlx_hostio.h"

/* CMSDK APB UART registers (the MPS2 boards' UART0..UART4). */
#define RLX_UART_OUT 0x40004000u
#define RLX_UART_CONSOLE 0x40005000u
#define RLX_UART_DATA 0x00u
#define RLX_UART_STATE 0x04u  /* bit 0: TX buffer full */
#define RLX_UART_CTRL 0x08u   /* bit 0: TX enable */
#define RLX_UART_BAUDDIV 0x10u
#define RLX_REG(base, off) (*(volatile uint32_t *)((base) + (off)))

static void rlx_uart_init(uint32_t base)
{
    RLX_REG(base, RLX_UART_BAUDDIV) = 16u; /* the smallest divider the UART accepts */
    RLX_REG(base, RLX_UART_CTRL) = 1u;
}

static void rlx_uart_put(uint32_t base, uint8_t c)
{
    while (RLX_REG(base, RLX_UART_STATE) & 1u) {
    }
    RLX_REG(base, RLX_UART_DATA) = c;
}

void rlx_io_init(void)
{
    rlx_uart_init(RLX_UART_OUT);
    rlx_uart_init(RLX_UART_CONSOLE);
}

void rlx_out_write(const void *buf, uint32_t n)
{
    const uint8_t *p = (const uint8_t *)buf;
    while (n--) rlx_uart_put(RLX_UART_OUT, *p++);
}

void rlx_console_puts(const char *s)
{
    while (*s) rlx_uart_put(RLX_UART_CONSOLE, (uint8_t)*s++);
}

void rlx_console_u32(uint32_t v)
{
    char buf[11];
    int i = 10;
    buf[i] = 0;
    do {
        buf[--i] = (char)('0' + v % 10u);
        v /= 10u;
    } while (v);
    rlx_console_puts(buf + i);
}

void rlx_exit(int32_t code)
{
    /* Called from the fault handler too: no stack beyond a few words, no state it could have broken. */
    rlx_console_puts("rlx: exit ");
    if (code < 0) {
        rlx_console_puts("-");
        rlx_console_u32((uint32_t)(-code));
    } else {
        rlx_console_u32((uint32_t)code);
    }
    rlx_console_puts("\n");
    __asm__ volatile("dsb" ::: "memory");
    *(volatile uint32_t *)0xE000ED0Cu = 0x05FA0004u; /* AIRCR: VECTKEY | SYSRESETREQ */
    __asm__ volatile("dsb" ::: "memory");
    for (;;) {
    }
}
