// tests/gpu/test_quantize_cuda.c — `llmq quantize --device cuda` against `--device cpu` on SmolLM2 (label gpu; exits
// 77 = skipped without a device, without $LLMQ_BIN, or without the model or the text): issue 17's agreement of the
// whole pipeline on the device with the CPU's.
//
// Model: tests/cli_util.h test_smollm2_gpu_model (the bundle's SmolLM2 cut to 4 blocks under tests/gpu/run.sh; a
// Q4_1 file, so --allow-requantize). Calibration: 8 sequences of 128 tokens of wiki.valid.raw, seed 1.
//   gptq  --bits 4 --group-size 64 --format gptq: on cuda the decoder blocks run through kernels/block.h (quant/
//         quantize.h "Decoder blocks": its info line is checked) and GPTQ's steps 5-7 through kernels/gptq_cuda.h.
//   awq   --bits 4 --group-size 64 --format awq: on cuda the scale search on the block path (quant/awq.h "On the block
//         path": candidates, halves and losses on the device, the single-linear groups in Gram form), the clip
//         search on the host.
// Checks, for each method:
//   1. the 4-bit codes of every *.qweight tensor equal position by position (a bijection of the codes: both runs
//      pack alike) on >= 99% of the weights (issue 17): the statistics differ by float rounding, and a code at a
//      rounding boundary may flip, which GPTQ then compensates on the columns after it;
//   2. the perplexity of both outputs (llmq eval on the CPU, wiki.test.raw, 4 chunks of 512) within 0.5%;
//   3. cuda again: the same model.safetensors bytes (each device is deterministic on its own).
// Then a MEASUREMENT, not a check: gptq on cuda with the block's linears on TF32 tensor cores (LLMQ_BLOCK_MATH=tf32,
// calib/model/devblock.h), its codes against the cpu run's and its perplexity, printed for issue 17's record of each
// reduced-precision choice's effect.
// NEVER RUN ON A GPU YET (written without one): its first run is tests/gpu/run.sh's.
#include "cli_util.h"

#include "common/io.h"
#include "formats/safetensors.h"

#include <math.h>
#include <stdlib.h>

static char tmp[] = "/tmp/llmq_quantize_cuda_XXXXXX";
static int failures;

// The fraction of equal 4-bit codes over every *.qweight tensor of the two directories' model.safetensors.
static double codes_equal(const char *a_dir, const char *b_dir) {
    struct llmq_st_model *a = NULL, *b = NULL;
    CHECK_OK(llmq_st_open(a_dir, &a));
    CHECK_OK(llmq_st_open(b_dir, &b));
    int64_t same = 0, total = 0;
    for (int64_t i = 0; i < llmq_st_n_tensors(a); i++) {
        const struct llmq_tensor_view *va = llmq_st_tensor(a, i), *vb = llmq_st_get(b, va->name);
        const size_t n = strlen(va->name);
        if (n < 8 || strcmp(va->name + n - 8, ".qweight") != 0) continue;
        CHECK(vb && vb->nbytes == va->nbytes);
        const uint8_t *pa = va->data, *pb = vb->data;
        int64_t s = 0;
        for (size_t k = 0; k < va->nbytes; k++) {
            const uint8_t x = pa[k] ^ pb[k];
            s += ((x & 0x0f) == 0) + ((x & 0xf0) == 0);
        }
        same += s;
        total += 2 * (int64_t)va->nbytes;
    }
    llmq_st_free(a), llmq_st_free(b);
    CHECK(total > 0);
    return (double)same / (double)total;
}

static double ppl_of(const char *bin, const char *dir, const char *text, const char *name) {
    CHECK(test_run("%s eval --model %s --ppl %s --ctx 512 --chunks 4 --threads 8 --device cpu --json %s/%s.ppl.json "
                   "2>%s/%s.ppl.err",
                   bin, dir, text, tmp, name, tmp, name) == 0);
    char file[64];
    snprintf(file, sizeof file, "%s.ppl.json", name);
    json_t *j = test_load_json(tmp, file);
    const double p = json_number_value(json_object_get(j, "ppl"));
    json_decref(j);
    return p;
}

static bool same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    CHECK_OK(llmq_read_file(a, (size_t)1 << 31, &x, &nx));
    CHECK_OK(llmq_read_file(b, (size_t)1 << 31, &y, &ny));
    const bool same = nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return same;
}

static const char *const quantize_fmt =
    "%s quantize --model %s --method %s --bits 4 --group-size 64 --format %s --allow-requantize --calib %s --nsamples "
    "8 "
    "--seqlen 128 --seed 1 --threads 8 --device %s --no-checkpoint --out %s/%s-%s 2>%s/%s-%s.err";

// gptq on cuda with TF32 linears (LLMQ_BLOCK_MATH=tf32): its codes against the cpu run's and its perplexity, printed.
static void measure_tf32(const char *bin, const char *model, const char *calib, const char *test, double ppl_cpu) {
    char cmd[4096], dc[1200], dt[1200];
    snprintf(cmd, sizeof cmd, "LLMQ_BLOCK_MATH=tf32 %s", quantize_fmt);
    if (test_run(cmd, bin, model, "gptq", "gptq", calib, "cuda", tmp, "gptq", "tf32", tmp, "gptq", "tf32") != 0) {
        printf("gptq tf32: the run failed (see %s/gptq-tf32.err)\n", tmp);
        return;
    }
    snprintf(dc, sizeof dc, "%s/gptq-cpu", tmp);
    snprintf(dt, sizeof dt, "%s/gptq-tf32", tmp);
    const double eq = codes_equal(dc, dt), p = ppl_of(bin, dt, test, "gptq-tf32");
    printf("gptq tf32 (measured, not checked): codes equal to cpu %.5f, ppl %.6g (cpu %.6g, rel %.3g)\n", eq, p,
           ppl_cpu, fabs(p - ppl_cpu) / ppl_cpu);
}

static double check_method(const char *bin, const char *model, const char *calib, const char *test, const char *method,
                           const char *format) {
    const char *q = quantize_fmt;
    CHECK(test_run(q, bin, model, method, format, calib, "cpu", tmp, method, "cpu", tmp, method, "cpu") == 0);
    CHECK(test_run(q, bin, model, method, format, calib, "cuda", tmp, method, "cuda", tmp, method, "cuda") == 0);
    CHECK(test_run(q, bin, model, method, format, calib, "cuda", tmp, method, "cuda2", tmp, method, "cuda2") == 0);
    char dc[1200], dg[1200], dg2[1200], fg[1300], fg2[1300], name[64];
    snprintf(dc, sizeof dc, "%s/%s-cpu", tmp, method);
    snprintf(dg, sizeof dg, "%s/%s-cuda", tmp, method);
    snprintf(dg2, sizeof dg2, "%s/%s-cuda2", tmp, method);
    { // both methods' passes take the block path on the device
        char *err = NULL;
        size_t len = 0;
        snprintf(name, sizeof name, "%s-cuda.err", method);
        CHECK_OK(llmq_read_file(test_path(tmp, name), 1 << 22, &err, &len));
        CHECK_CONTAINS(err, "quantize: decoder blocks on cuda through kernels/block.h");
        free(err);
    }
    const double eq = codes_equal(dc, dg);
    snprintf(name, sizeof name, "%s-cpu", method);
    const double pc = ppl_of(bin, dc, test, name);
    snprintf(name, sizeof name, "%s-cuda", method);
    const double pg = ppl_of(bin, dg, test, name);
    snprintf(fg, sizeof fg, "%s/model.safetensors", dg);
    snprintf(fg2, sizeof fg2, "%s/model.safetensors", dg2);
    const bool rerun = same_file(fg, fg2);
    const bool ok = eq >= 0.99 && isfinite(pc) && pc > 1.0 && fabs(pg - pc) <= 0.005 * pc && rerun;
    printf("%-5s into %-4s: codes equal %.5f (>= 0.99), ppl cpu %.6g cuda %.6g (rel %.3g, <= 0.005), cuda rerun %s: "
           "%s\n",
           method, format, eq, pc, pg, fabs(pg - pc) / pc, rerun ? "the same bytes" : "DIFFERS", ok ? "ok" : "FAIL");
    failures += !ok;
    return pc;
}

int main(void) {
    char model[1024], calib[1024], test[1024];
    const char *bin = test_smollm2_gpu_inputs("wiki.valid.raw", model, sizeof model, calib, sizeof calib, tmp);
    snprintf(test, sizeof test, "%s/wikitext-2-raw/wiki.test.raw", test_data_dir());
    const double ppl_gptq = check_method(bin, model, calib, test, "gptq", "gptq");
    check_method(bin, model, calib, test, "awq", "awq");
    measure_tf32(bin, model, calib, test, ppl_gptq);
    if (failures)
        fprintf(stderr, "%d checks failed (outputs kept in %s)\n", failures, tmp);
    else
        test_run("rm -rf %s", tmp);
    return failures ? 1 : 0;
}
