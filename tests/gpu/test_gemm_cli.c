// tests/gpu/test_gemm_cli.c — `--device cuda` against `--device cpu` end to end on stories260K
// (label gpu; exits 77 = skipped without a device, without $LLMQ_BIN or without the model).
//
//   llmq eval      PPL on 8 chunks of 256 tokens of wikitext-2: |ppl_cuda - ppl_cpu| <= 1e-4 · ppl_cpu
//                  (the logits differ by float rounding, ~1e-6 relative, and PPL = exp(mean NLL));
//                  a second cuda run must give the same PPL bits (reruns are deterministic per device).
//   llmq quantize  --method gptq, 4 sequences of 64 tokens, --format fake, on both devices: both
//                  succeed, same layers, every layer's ‖WX-QX‖²/‖WX‖² within 5% (+1e-6) of the CPU
//                  one (the XᵀX and the forward differ in rounding, so a few weights may round the other
//                  way; a wrong product would change the errors by far more).
// stories260K's products are all under the default device threshold, so the cuda runs set
// LLMQ_GEMM_CUDA_MIN_WORK=0 to put every dispatched product on the device. The eval runs set LLMQ_EVAL_BLOCK=off:
// this test is about forward.c's path with its products on the device (what eval falls back to for the families
// and modes kernels/block.h does not cover); eval's block path is tests/gpu/test_eval_cuda.c's.
#include "cli_util.h"

#include "kernels/backend.h"

#include <math.h>
#include <stdlib.h>

static char tmp[] = "/tmp/llmq_gemm_cli_XXXXXX";

int main(void) {
    test_need_cuda();
    char model[1024], text[1024];
    test_stories260k(model, sizeof model, "tinyllamas-stories-260k-f32.gguf");
    snprintf(text, sizeof text, "%s/wikitext-2-raw/wiki.valid.raw", test_data_dir());
    const char *bin = test_need_llmq_inputs(model, text);
    CHECK(mkdtemp(tmp));
    const char *eval = "%s%s eval --model %s --ppl %s --ctx 256 --chunks 8 --threads 4 --device %s --json %s/%s";
    CHECK(test_run(eval, "", bin, model, text, "cpu", tmp, "eval_cpu.json") == 0);
    const char *env = "LLMQ_GEMM_CUDA_MIN_WORK=0 LLMQ_EVAL_BLOCK=off ";
    CHECK(test_run(eval, env, bin, model, text, "cuda", tmp, "eval_cuda.json") == 0);
    CHECK(test_run(eval, env, bin, model, text, "cuda", tmp, "eval_cuda2.json") == 0);
    json_t *ec = test_load_json(tmp, "eval_cpu.json"), *eg = test_load_json(tmp, "eval_cuda.json"),
           *eg2 = test_load_json(tmp, "eval_cuda2.json");
    const double pc = json_real_value(json_object_get(ec, "ppl")), pg = json_real_value(json_object_get(eg, "ppl"));
    const double pg2 = json_real_value(json_object_get(eg2, "ppl"));
    fprintf(stderr, "eval: ppl cpu %.10g cuda %.10g (rel %.3g), cuda rerun %.10g\n", pc, pg, fabs(pg - pc) / pc, pg2);
    CHECK(pc > 1.0 && isfinite(pc));
    CHECK(fabs(pg - pc) <= 1e-4 * pc);
    CHECK(pg2 == pg);
    CHECK(strncmp(json_string_value(json_object_get(eg, "device")), "cuda:0 ", 7) == 0);
    CHECK(strncmp(json_string_value(json_object_get(ec, "device")), "cpu", 3) == 0);

    const char *quant = "%s%s quantize --model %s --method gptq --bits 4 --group-size -1 --calib %s --nsamples 4 "
                        "--seqlen 64 --threads 4 --format fake --device %s --out %s/%s --json %s/%s.json";
    CHECK(test_run(quant, "", bin, model, text, "cpu", tmp, "q_cpu", tmp, "q_cpu") == 0);
    CHECK(test_run(quant, "LLMQ_GEMM_CUDA_MIN_WORK=0 ", bin, model, text, "cuda", tmp, "q_cuda", tmp, "q_cuda") == 0);
    json_t *qc = test_load_json(tmp, "q_cpu.json"), *qg = test_load_json(tmp, "q_cuda.json");
    json_t *lc = json_object_get(qc, "layers"), *lg = json_object_get(qg, "layers");
    CHECK(json_array_size(lc) > 0 && json_array_size(lc) == json_array_size(lg));
    int bad = 0;
    for (size_t i = 0; i < json_array_size(lc); i++) {
        json_t *a = json_array_get(lc, i), *b = json_array_get(lg, i);
        const char *name = json_string_value(json_object_get(a, "name"));
        CHECK(strcmp(name, json_string_value(json_object_get(b, "name"))) == 0);
        const double ea = json_real_value(json_object_get(a, "err")), eb = json_real_value(json_object_get(b, "err"));
        const bool ok = isfinite(eb) && fabs(eb - ea) <= 0.05 * ea + 1e-6;
        if (!ok || i < 3) fprintf(stderr, "%s %s: err cpu %.6g cuda %.6g\n", ok ? "ok " : "BAD", name, ea, eb);
        bad += !ok;
    }
    CHECK(bad == 0);
    CHECK(strncmp(json_string_value(json_object_get(qg, "device")), "cuda:0 ", 7) == 0);
    json_decref(ec), json_decref(eg), json_decref(eg2), json_decref(qc), json_decref(qg);
    test_run("rm -rf %s", tmp);
    printf("gemm cli: cuda and cpu agree (ppl rel %.3g)\n", fabs(pg - pc) / pc);
    return 0;
}
