// cli/cmd_devices.c — `llmq devices`: the CUDA devices this binary can use; and the --device choice
// of the other commands (cli_device).
#include "cli/args.h"
#include "cli/commands.h"
#include "common/log.h"
#include "kernels/backend.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

int cli_device(const char *name, enum llmq_backend *be, char *desc, size_t desc_n) {
    enum llmq_status st = llmq_backend_select(name, be);
    if (st) return st == LLMQ_ERR_ARG ? 2 : 1; // the error line is out
    struct llmq_device_info d;
    const char *why = NULL;
    if (*be == LLMQ_BACKEND_CUDA) {
        if ((st = llmq_cuda_device_info(0, &d))) return 1;
        snprintf(desc, desc_n, "cuda:0 %s (%d SMs)", d.name, d.sm_count);
    } else if (strcmp(name, "auto") == 0 && llmq_cuda_device_count(&why) == 0) {
        snprintf(desc, desc_n, "cpu (no CUDA device found: %s)", why ? why : "unknown reason");
    } else {
        snprintf(desc, desc_n, "cpu");
    }
    llmq_info("device: %s", desc);
    return 0;
}

int cmd_devices(int argc, char **argv) {
    bool json = false;
    const struct cli_flag flags[] = {
        {"json", CLI_BOOL, &json, "off", "print the device list as JSON on stdout"},
    };
    const struct cli_cmd cmd = {
        "devices", "[flags]", "List the CUDA devices llmq can use (the CPU backend is always available).",
        NULL,      flags,     1,
        0,         0};
    const char *pos[1];
    int n_pos, rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;

    const char *why = NULL;
    int n = llmq_cuda_device_count(&why);
    json_t *arr = json_array();
    if (!json) printf("cpu: available\n");
    if (n == 0 && !json) printf("cuda: no devices (%s)\n", why ? why : "unknown reason");
    for (int i = 0; i < n; i++) {
        struct llmq_device_info d;
        if (llmq_cuda_device_info(i, &d) != LLMQ_OK) continue;
        if (json) {
            char cc[16];
            snprintf(cc, sizeof(cc), "%d.%d", d.cc_major, d.cc_minor);
            json_array_append_new(arr,
                                  json_pack("{s:i, s:s, s:I, s:I, s:s, s:i}", "index", i, "name", d.name, "total_bytes",
                                            (json_int_t)d.total_mem, "free_bytes", (json_int_t)d.free_mem,
                                            "compute_capability", cc, "sm_count", d.sm_count));
        } else {
            printf("cuda:%d: %s, compute %d.%d, %d SMs, %.1f GiB (%.1f GiB free)\n", i, d.name, d.cc_major, d.cc_minor,
                   d.sm_count, d.total_mem / 1073741824.0, d.free_mem / 1073741824.0);
        }
    }
    if (json) {
        json_t *root = json_pack("{s:b, s:o, s:s?}", "cuda_compiled", llmq_backend_cuda_compiled(), "cuda_devices", arr,
                                 "reason", n == 0 ? why : NULL);
        char *s = json_dumps(root, JSON_INDENT(2));
        puts(s);
        free(s);
        json_decref(root);
    } else {
        json_decref(arr);
    }
    return 0;
}
