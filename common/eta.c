// common/eta.c — the work-model ETA of common/eta.h.
#include "common/eta.h"

#include <stdio.h>

void llmq_eta_init(struct llmq_eta *e, double total_work, double now) {
    *e = (struct llmq_eta){.total = total_work > 0 ? total_work : 0, .done = 0, .t0 = now};
}

void llmq_eta_credit(struct llmq_eta *e, double work) {
    if (work > 0) e->done += work;
    if (e->done > e->total) e->done = e->total;
}

double llmq_eta_remaining(const struct llmq_eta *e, double now) {
    if (e->done >= e->total) return 0;
    if (e->done < LLMQ_ETA_MIN_FRACTION * e->total || e->done <= 0) return -1;
    double el = now - e->t0;
    return (el > 0 ? el : 0) * (e->total - e->done) / e->done;
}

void llmq_eta_format(double secs, char *buf, size_t n) {
    if (secs < 0) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)(secs + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}
