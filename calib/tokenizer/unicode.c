// calib/tokenizer/unicode.c — see calib/tokenizer/unicode.h. Mirrors llama.cpp src/unicode.cpp (decoding rules) with
// our own generated class table.
#include "calib/tokenizer/unicode.h"

unsigned llmq_unicode_flags(uint32_t cpt) {
    if (cpt >= 0x110000) return LLMQ_UNICODE_UNASSIGNED;
    // largest entry whose first code point is <= cpt
    uint32_t key = (cpt << 4) | 0xFu;
    int32_t lo = 0, hi = llmq_unicode_n_ranges - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (llmq_unicode_ranges[mid] <= key)
            lo = mid;
        else
            hi = mid - 1;
    }
    return llmq_unicode_ranges[lo] & 0xFu;
}

uint32_t llmq_unicode_decode(const uint8_t *s, size_t n, size_t *adv) {
    uint8_t c = s[0];
    *adv = 1;
    if (c < 0x80) return c;
    if ((c & 0x40) == 0) return 0xFFFD; // stray continuation byte
    size_t len = (c & 0x20) == 0 ? 2 : (c & 0x10) == 0 ? 3 : (c & 0x08) == 0 ? 4 : 0;
    if (len == 0 || len > n) return 0xFFFD;
    uint32_t cpt = c & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cpt = (cpt << 6) | (s[i] & 0x3Fu);
    }
    *adv = len;
    return cpt;
}

int llmq_unicode_encode(uint32_t cpt, uint8_t out[4]) {
    if (cpt > 0x10FFFF) cpt = 0xFFFD;
    if (cpt <= 0x7F) {
        out[0] = (uint8_t)cpt;
        return 1;
    }
    if (cpt <= 0x7FF) {
        out[0] = (uint8_t)(0xC0 | (cpt >> 6));
        out[1] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt <= 0xFFFF) {
        out[0] = (uint8_t)(0xE0 | (cpt >> 12));
        out[1] = (uint8_t)(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cpt >> 18));
    out[1] = (uint8_t)(0x80 | ((cpt >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cpt >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cpt & 0x3F));
    return 4;
}
