/* Host harness: read the inputs from rlx_in.bin, run the model once, write the outputs to rlx_out.bin,
 * all through semihosting (QEMU -semihosting, or a debugger), and the stack high-water mark to
 * rlx_stats.bin (one uint32). Exit status 0 = success. */
#include "rlx_io.h"
#include "rlx_semihost.h"

int main(void)
{
    uint32_t i;
    int32_t h = rlx_sh_open("rlx_in.bin", RLX_SH_MODE_RB);
    if (h < 0) {
        rlx_sh_puts("rlx: cannot open rlx_in.bin\n");
        return 10;
    }
    for (i = 0; i < rlx_model_num_inputs; i++) {
        if (rlx_sh_read(h, rlx_model_inputs[i].data, rlx_model_inputs[i].nbytes) != 0) {
            rlx_sh_puts("rlx: rlx_in.bin is too short\n");
            return 11;
        }
    }
    rlx_sh_close(h);
    rlx_model_run();
    h = rlx_sh_open("rlx_out.bin", RLX_SH_MODE_WB);
    if (h < 0) {
        rlx_sh_puts("rlx: cannot create rlx_out.bin\n");
        return 12;
    }
    for (i = 0; i < rlx_model_num_outputs; i++) {
        if (rlx_sh_write(h, rlx_model_outputs[i].data, rlx_model_outputs[i].nbytes) != 0) {
            rlx_sh_puts("rlx: writing rlx_out.bin failed\n");
            return 13;
        }
    }
    rlx_sh_close(h);
    /* Statistics for the host: the stack high-water mark. */
    uint32_t stats[1] = {rlx_stack_peak_bytes()};
    h = rlx_sh_open("rlx_stats.bin", RLX_SH_MODE_WB);
    if (h >= 0) {
        rlx_sh_write(h, stats, sizeof stats);
        rlx_sh_close(h);
    }
    return 0;
}
