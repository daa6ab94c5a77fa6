/* Fixed-width integer types without a C library (the firmware is freestanding: no libc, no heap). */
#ifndef RLX_TYPES_H
#define RLX_TYPES_H
typedef __INT8_TYPE__ int8_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __INT16_TYPE__ int16_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __INT32_TYPE__ int32_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT64_TYPE__ uint64_t;
#define INT32_MIN_ (-2147483647 - 1)
#define INT32_MAX_ 2147483647
#endif
