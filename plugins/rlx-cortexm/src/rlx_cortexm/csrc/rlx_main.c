/* Host harness: take the inputs from the inbox (rlx_in.bin, loaded into RAM by the runner), run the
 * model once, send the outputs over UART0 (they become rlx_out.bin) and the stack high-water mark on
 * the console. No semihosting (see rlx_hostio.h). Exit status 0 = success. */
#include "rlx_hostio.h"
#include "rlx_io.h"

int main(void)
{
    uint32_t i, want = 0, got = rlx_inbox[0];
    const uint8_t *src = (const uint8_t *)&rlx_inbox[1];
    rlx_io_init();
    for (i = 0; i < rlx_model_num_inputs; i++) want += rlx_model_inputs[i].nbytes;
    if (got != want) {
        rlx_console_puts("rlx: rlx_in.bin has ");
        rlx_console_u32(got);
        rlx_console_puts(" bytes, the model reads ");
        rlx_console_u32(want);
        rlx_console_puts("\n");
        return 11;
    }
    for (i = 0; i < rlx_model_num_inputs; i++) {
        uint8_t *dst = (uint8_t *)rlx_model_inputs[i].data;
        uint32_t k;
        for (k = 0; k < rlx_model_inputs[i].nbytes; k++) dst[k] = *src++;
    }
    rlx_model_run();
    for (i = 0; i < rlx_model_num_outputs; i++) {
        rlx_out_write(rlx_model_outputs[i].data, rlx_model_outputs[i].nbytes);
    }
    rlx_console_puts("rlx: stack ");
    rlx_console_u32(rlx_stack_peak_bytes());
    rlx_console_puts("\n");
    return 0;
}
