// tests/unit/test_eta.c — the work-model ETA (common/eta.h) on synthetic timings.
#include "harness.h"

#include "common/eta.h"

#include <math.h>

// Items of uneven cost (1, 4, 9, ..., 100) processed at a constant 0.5 s per unit after a 30 s setup:
// the estimate after each item (from 1% of the work on) is exact, where the old estimator (elapsed since
// the setup began, divided per item) is off by the setup and by the items' unequal sizes.
static void test_exact_under_a_constant_rate(void) {
    double total = 0, t = 30.0, rate = 0.5;
    for (int i = 1; i <= 10; i++) total += i * i;
    struct llmq_eta e;
    llmq_eta_init(&e, total, t);
    double done = 0;
    for (int i = 1; i <= 10; i++) {
        t += rate * i * i;
        done += i * i;
        llmq_eta_credit(&e, i * i);
        double want = rate * (total - done), got = llmq_eta_remaining(&e, t);
        if (done < LLMQ_ETA_MIN_FRACTION * total)
            CHECK(got < 0); // item 1: 1 of 385 units, unknown yet
        else
            CHECK(fabs(got - want) <= 1e-9 * (1 + want));
        // the extrapolation it replaces: elapsed since the setup began, per item; after item 2 that is
        // 32.5 s / 2 x 8 = 130 s against the true 190 s
        if (i == 2) CHECK(fabs((t - 0.0) / i * (10 - i) - want) > 50);
    }
    CHECK(llmq_eta_remaining(&e, t) == 0);
}

// Nothing is said before LLMQ_ETA_MIN_FRACTION of the work is done, and the formatter shows it as "?".
static void test_unknown_before_min_fraction(void) {
    struct llmq_eta e;
    char buf[16];
    llmq_eta_init(&e, 1000, 0);
    CHECK(llmq_eta_remaining(&e, 5) < 0);
    llmq_eta_credit(&e, 9.99);
    CHECK(llmq_eta_remaining(&e, 5) < 0);
    llmq_eta_credit(&e, 0.01); // 1%: 10 units in 5 s -> 990 units in 495 s
    CHECK(fabs(llmq_eta_remaining(&e, 5) - 495) < 1e-9);
    llmq_eta_format(llmq_eta_remaining(&e, 4), buf, sizeof buf);
    CHECK(strcmp(buf, "6m36s") == 0); // 990 * 0.4 = 396 s
    llmq_eta_format(-1, buf, sizeof buf);
    CHECK(strcmp(buf, "?") == 0);
    llmq_eta_format(3 * 3600 + 125, buf, sizeof buf);
    CHECK(strcmp(buf, "3h02m") == 0);
    llmq_eta_format(7.4, buf, sizeof buf);
    CHECK(strcmp(buf, "7s") == 0);
    llmq_eta_credit(&e, 5000); // over-crediting clamps at the total: done
    CHECK(llmq_eta_remaining(&e, 6) == 0);
}

// A phase whose rate changes (e.g. the second half twice as slow) is tracked by the measured average: the
// estimate is the elapsed-weighted rate, never negative, and 0 at the end.
static void test_rate_change_tracked(void) {
    struct llmq_eta e;
    llmq_eta_init(&e, 100, 10);
    llmq_eta_credit(&e, 50);
    CHECK(fabs(llmq_eta_remaining(&e, 60) - 50) < 1e-9); // 1 s per unit so far
    llmq_eta_credit(&e, 25);                             // at 2 s per unit: 25 units in 50 s
    double r = llmq_eta_remaining(&e, 110);              // 100 s for 75 units -> 25 units in 33.3 s
    CHECK(fabs(r - 100.0 / 3.0) < 1e-9);
    llmq_eta_credit(&e, 25);
    CHECK(llmq_eta_remaining(&e, 160) == 0);
}

int main(void) {
    test_exact_under_a_constant_rate();
    test_unknown_before_min_fraction();
    test_rate_change_tracked();
    return 0;
}
