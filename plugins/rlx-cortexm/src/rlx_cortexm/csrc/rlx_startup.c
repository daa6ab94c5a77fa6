/* Reset handler and vector table for the MPS2 boards (code at 0x0, data/bss/stack at 0x20000000):
 * copy .data, clear .bss, enable the FPU when the code uses it, run main, exit (rlx_hostio.h). */
#include "rlx_hostio.h"

extern uint32_t _estack, _sstack, _sidata, _sdata, _edata, _sbss, _ebss;
#define RLX_STACK_PAINT 0xA5A5A5A5u
int main(void);

void *memcpy(void *dst, const void *src, __SIZE_TYPE__ n);
void *memmove(void *dst, const void *src, __SIZE_TYPE__ n);
void *memset(void *dst, int c, __SIZE_TYPE__ n);

__attribute__((noreturn)) void rlx_reset_handler(void)
{
    uint32_t *src = &_sidata, *dst = &_sdata;
    while (dst < &_edata) *dst++ = *src++;
    for (dst = &_sbss; dst < &_ebss;) *dst++ = 0;
    /* Paint the unused stack so rlx_stack_peak_bytes() can measure the high-water mark. */
    uint32_t *sp;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
    for (dst = &_sstack; dst < sp - 16; dst++) *dst = RLX_STACK_PAINT;
#if defined(__ARM_FP)
    *(volatile uint32_t *)0xE000ED88u |= (0xFu << 20); /* CPACR: full access to CP10/CP11 */
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#endif
    rlx_exit(main());
}

uint32_t rlx_stack_peak_bytes(void)
{
    const uint32_t *p = &_sstack;
    while (p < &_estack && *p == RLX_STACK_PAINT) p++;
    return (uint32_t)((const uint8_t *)&_estack - (const uint8_t *)p);
}

__attribute__((noreturn)) void rlx_fault_handler(void)
{
    /* Also where a semihosting call (bkpt 0xAB) ends up: the runner does not enable semihosting. */
    rlx_io_init();
    rlx_console_puts("rlx: CPU fault (HardFault/MemManage/BusFault/UsageFault)\n");
    rlx_exit(3);
}

__attribute__((section(".isr_vector"), used)) void *const rlx_vectors[16] = {
    (void *)&_estack, (void *)rlx_reset_handler, (void *)rlx_fault_handler, (void *)rlx_fault_handler,
    (void *)rlx_fault_handler, (void *)rlx_fault_handler, (void *)rlx_fault_handler, 0, 0, 0, 0,
    (void *)rlx_fault_handler, (void *)rlx_fault_handler, 0, (void *)rlx_fault_handler,
    (void *)rlx_fault_handler,
};

/* The compiler may emit calls to these even in freestanding code. */
void *memcpy(void *dst, const void *src, __SIZE_TYPE__ n)
{
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    while (n--) *d++ = *s++;
    return dst;
}

void *memmove(void *dst, const void *src, __SIZE_TYPE__ n)
{
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    if (d < s) {
        while (n--) *d++ = *s++;
    } else {
        while (n--) d[n] = s[n];
    }
    return dst;
}

void *memset(void *dst, int c, __SIZE_TYPE__ n)
{
    uint8_t *d = (uint8_t *)dst;
    while (n--) *d++ = (uint8_t)c;
    return dst;
}
