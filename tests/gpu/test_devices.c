// tests/gpu/test_devices.c — the CUDA backend sees the device it reports (label gpu; exits 77 =
// skipped when llmq was built without CUDA or no device is present).
#include "harness.h"

#include "kernels/backend.h"

int main(void) {
    const char *why = NULL;
    int n = llmq_cuda_device_count(&why);
    if (n == 0) {
        fprintf(stderr, "skipped: no CUDA device (%s)\n", why ? why : "?");
        return TEST_SKIP;
    }
    for (int i = 0; i < n; i++) {
        struct llmq_device_info d;
        CHECK(llmq_cuda_device_info(i, &d) == LLMQ_OK);
        CHECK(d.name[0] != '\0');
        CHECK(d.total_mem > 0 && d.free_mem <= d.total_mem);
        CHECK(d.cc_major >= 5);
        printf("cuda:%d %s cc %d.%d\n", i, d.name, d.cc_major, d.cc_minor);
    }
    enum llmq_backend b;
    CHECK(llmq_backend_select("cuda", &b) == LLMQ_OK && b == LLMQ_BACKEND_CUDA);
    CHECK(llmq_backend_select("auto", &b) == LLMQ_OK && b == LLMQ_BACKEND_CUDA);
    return 0;
}
