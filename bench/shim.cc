/* SPDX-License-Identifier: MIT */
// The only C++ in kiln: register C benchmark bodies with Google Benchmark and forward state.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include "shim.h"

struct kb_state {
	benchmark::State *s;
	uint64_t bytes_per_iter;
	std::string label;
	double run_seconds[KB_SLOTS]; // kb_account totals for this run
	double run_bytes[KB_SLOTS];
};

namespace {

void set_results(benchmark::State &s, const kb_state &st)
{
	if (st.bytes_per_iter)
		s.SetBytesProcessed(static_cast<int64_t>(st.bytes_per_iter) * s.iterations());
	if (!st.label.empty())
		s.SetLabel(st.label);
}

void run_batches(benchmark::State &s, kb_body body, void *arg)
{
	kb_state st{&s, 0, {}, {}, {}};
	// Batches of up to 64 iterations: one C call per batch, not per iteration.
	const benchmark::IterationCount batch = std::min<benchmark::IterationCount>(64, s.max_iterations);
	while (s.KeepRunningBatch(batch))
		body(&st, static_cast<uint64_t>(batch), arg);
	set_results(s, st);
}

} // namespace

extern "C" {

void kb_register(const char *name, kb_body body, void *arg)
{
	benchmark::RegisterBenchmark(name, run_batches, body, arg);
}

void kb_register_fixed(const char *name, kb_body body, void *arg, uint64_t iters,
		       int repetitions)
{
	benchmark::RegisterBenchmark(name, [=](benchmark::State &s) {
		kb_state st{&s, 0, {}, {}, {}};
		for (auto _ : s)
			body(&st, 1, arg);
		set_results(s, st);
	})
		->Iterations(static_cast<benchmark::IterationCount>(iters))
		->UseRealTime()
		->Repetitions(repetitions)
		->ReportAggregatesOnly(repetitions > 1)
		->ComputeStatistics("min", [](const std::vector<double> &v) {
			return *std::min_element(v.begin(), v.end());
		})
		->ComputeStatistics("max", [](const std::vector<double> &v) {
			return *std::max_element(v.begin(), v.end());
		});
}

void kb_pause(kb_state *st)
{
	st->s->PauseTiming();
}

void kb_resume(kb_state *st)
{
	st->s->ResumeTiming();
}

void kb_set_bytes_per_iter(kb_state *st, uint64_t bytes)
{
	st->bytes_per_iter = bytes;
}

void kb_counter(kb_state *st, const char *name, double value, int per_iter)
{
	st->s->counters[name] = benchmark::Counter(
		value, per_iter ? benchmark::Counter::kAvgIterations : benchmark::Counter::kDefaults);
}

void kb_label(kb_state *st, const char *label)
{
	st->label = label ? label : "";
}

void kb_account(kb_state *st, int slot, double seconds, double bytes)
{
	if (slot < 0 || slot >= KB_SLOTS)
		return;
	st->run_seconds[slot] += seconds;
	st->run_bytes[slot] += bytes;
}

double kb_run_rate(const kb_state *st, int slot)
{
	if (slot < 0 || slot >= KB_SLOTS || st->run_seconds[slot] <= 0)
		return 0;
	return st->run_bytes[slot] / st->run_seconds[slot];
}

void kb_skip(kb_state *st, const char *message)
{
	st->s->SkipWithError(message);
}

int kb_main(int argc, char **argv)
{
	benchmark::Initialize(&argc, argv);
	if (benchmark::ReportUnrecognizedArguments(argc, argv))
		return 2;
	benchmark::RunSpecifiedBenchmarks();
	benchmark::Shutdown();
	return 0;
}
}
