/* AMX's tile configuration, shared by the sources that run the tiles (amx_bf16.c,
 * amx_attention.c); included only where ISA_AMX_BF16 is defined. */
#ifndef PAGEDLLM_AMX_TILES_H
#define PAGEDLLM_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* ldtilecfg's 64-byte operand (palette 1). */
typedef struct __attribute__((aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Configure this thread's eight tiles: rows[t] rows of 64 bytes each (0: unused). */
static inline void configure_tile_rows(const int rows[8]) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = (uint8_t)rows[t];
        cfg.colsb[t] = rows[t] ? 64 : 0;
    }
    _tile_loadconfig(&cfg);
}

#endif
