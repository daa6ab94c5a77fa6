/* The model's input/output table (defined in the generated rlx_model.c) and its entry point. */
#ifndef RLX_IO_H
#define RLX_IO_H
#include "rlx_types.h"

typedef struct {
    void *data;      /* the tensor's bytes: in the arena, or a constant in flash */
    uint32_t nbytes;
} rlx_io_t;

extern const rlx_io_t rlx_model_inputs[];
extern const uint32_t rlx_model_num_inputs;
extern const rlx_io_t rlx_model_outputs[];
extern const uint32_t rlx_model_num_outputs;

/* Run the model once: read the inputs from, and leave the outputs in, the places the tables name. */
void rlx_model_run(void);
#endif
