/*
 * common/eta.h — remaining-time estimates for long phases, from a work model.
 *
 * The caller states the phase's total work in units of its own cost model (quantize: per linear,
 * rows · cols · (calibration tokens + cols), i.e. its forward/Hessian/search products plus its solve or
 * error products) and credits each piece of work when it is actually done. The estimate is
 *   remaining = (total - done) · elapsed / done,   elapsed measured from llmq_eta_init,
 * so what runs before the phase (model load, tokenizing the calibration text) does not enter the rate, and
 * an item's share of the extrapolation is its share of the work, not 1 / (number of items). Until
 * LLMQ_ETA_MIN_FRACTION of the work is done the estimate is unknown ("?"): the first items of a phase pay
 * warm-up costs (page faults on the mapped model, thread start-up, caches) that a handful of seconds
 * cannot average out.
 * What it is not: a clock. Times are passed in (llmq_now_s() in production, synthetic in tests).
 */
#ifndef LLMQ_ETA_H
#define LLMQ_ETA_H

#include <stddef.h>

#define LLMQ_ETA_MIN_FRACTION 0.01 // of the total work done before an estimate is given

struct llmq_eta {
    double total; // work of the whole phase (> 0), in the caller's units
    double done;  // work credited so far
    double t0;    // seconds: when the phase started
};

void llmq_eta_init(struct llmq_eta *e, double total_work, double now);
// Adds completed work (clamped so that done never exceeds total).
void llmq_eta_credit(struct llmq_eta *e, double work);
// Seconds left at time now, or -1 while unknown (under LLMQ_ETA_MIN_FRACTION done); 0 when all is done.
double llmq_eta_remaining(const struct llmq_eta *e, double now);
// Renders seconds as "1h02m", "3m05s", "7s", and a negative value as "?", into buf (n bytes).
void llmq_eta_format(double secs, char *buf, size_t n);

#endif // LLMQ_ETA_H
