/*
 * common/sha256.h — SHA-256 (FIPS 180-4) of a byte buffer, for fingerprints in reports and file
 * headers (the text an evaluation ran on, the inputs of a quantization run). Not for security:
 * there is no constant-time guarantee. Streaming use: init, update any number of times, final.
 */
#ifndef LLMQ_SHA256_H
#define LLMQ_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct llmq_sha256 {
    uint32_t h[8];     // chaining state
    uint64_t n_bytes;  // message bytes hashed so far
    uint8_t block[64]; // pending partial block
    size_t n_block;    // bytes used in block
};

void llmq_sha256_init(struct llmq_sha256 *s);
void llmq_sha256_update(struct llmq_sha256 *s, const void *data, size_t n);
void llmq_sha256_final(struct llmq_sha256 *s, uint8_t digest[32]);

// One-shot digest of data[0..n).
void llmq_sha256(const void *data, size_t n, uint8_t digest[32]);
// Lower-case hex of a digest into hex (65 bytes: 64 digits and a NUL).
void llmq_sha256_hex(const uint8_t digest[32], char hex[65]);

#endif // LLMQ_SHA256_H
