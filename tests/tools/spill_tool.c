// tests/tools/spill_tool.c — one big buffer through common/spill.h, written in full:
//   spill_tool BYTES BUDGET     (llmq_spill_configure(BUDGET); llmq_big_alloc(BYTES); memset)
// Exit 0 when the buffer was allocated and written, 1 when the allocation was refused (its message on
// stderr). tests/py/test_robust.py runs it against a full spill directory.
#include "common/spill.h"

#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    size_t n = (size_t)strtoull(argv[1], NULL, 10);
    llmq_spill_configure(strtoull(argv[2], NULL, 10));
    void *p = llmq_big_alloc(n, "spill_tool buffer");
    if (!p) return 1;
    memset(p, 1, n); // a sparse spill file on a full file system dies here of SIGBUS
    llmq_big_free(p);
    return 0;
}
