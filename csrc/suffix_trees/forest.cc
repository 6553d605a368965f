// The structure drafter's suffix trees: arctic-inference 0.3.0's SuffixTree (vendored beside this
// file, unchanged but for one declaration) kept as its SuffixDecodingCache keeps them, a prompt tree
// per request and one global tree over the responses, with what the drafter asks of them each step
// in one call (`step`): every row's tokens added to both trees and its draft, at the kind's spec
// factor together with the longer draft at the extension's factor (one pass over the match lengths),
// row after row as vLLM's suffix proposer goes, so a row's nodes are still in cache when it drafts.
//
// A request started or continued (`start`, `adopt`) gets its prompt tree at once; its place in the
// global tree (a sequence id, its first response tokens, an eviction) waits for its row's turn in the
// next `step`, or for the next call that names it, so the global tree changes in the order the
// cache's calls, row by row, would change it.
//
// Drafts are those of SuffixDecodingCache.speculate (the same trees, the same walk, the prompt
// tree's draft on a tie); tests/test_suffix_source.py checks them against arctic-inference's cache.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "suffix_tree.h"

namespace py = pybind11;
using Tokens = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

namespace {

std::span<const int32_t> span_of(const Tokens& a) {
    return {a.data(), static_cast<size_t>(a.size())};
}

// speculate's cap on a draft at `factor` for a match of `match_len` tokens (offset 0), computed in
// the types SuffixTree::speculate uses, so the cap is the same integer.
int cap_of(int max_spec_tokens, int match_len, float factor) {
    const float offset = 0.0f;
    int cap = std::min(max_spec_tokens, static_cast<int>(match_len * factor + offset + 1e-6));
    return std::max(cap, 0);
}

// `best` becomes the first `cap` tokens of `path` where they score at least `best` (speculate's rule:
// on a tie the longer match wins); the score summed as _speculate_path sums it.
void keep_if_better(Draft& best, const Draft& path, int cap, int match_len) {
    size_t n = std::min(static_cast<size_t>(cap), path.token_ids.size());
    float score = 0.0f;
    for (size_t i = 0; i < n; i++) score += path.probs[i];
    if (score < best.score) return;
    best.token_ids.assign(path.token_ids.begin(), path.token_ids.begin() + n);
    best.parents.assign(path.parents.begin(), path.parents.begin() + n);
    best.probs.assign(path.probs.begin(), path.probs.begin() + n);
    best.score = score;
    best.match_len = match_len;
}

// A draft's tokens and each token's confidence given the ones before it: the tree gives the
// probability of the path up to each token, the ratio of consecutive ones is the token's own
// (computed in double from the float probabilities, capped at 1).
void tokens_and_confidences(const Draft& d, size_t from, py::list& tokens, py::list& confs) {
    double before = 1.0;
    for (size_t i = 0; i < d.probs.size(); i++) {
        double p = d.probs[i];
        double c = 0.0;
        if (before > 0) {
            double ratio = p / before;
            c = ratio > 1.0 ? 1.0 : ratio;
        }
        before = p;
        if (i < from) continue;
        tokens.append(d.token_ids[i]);
        confs.append(c);
    }
}

const Draft& higher(const Draft& mine, const Draft& shared) {
    return mine.score >= shared.score ? mine : shared;
}

// A prompt tree taken out of the forest, freed by `release` without the GIL (the drafter's reaper
// thread calls it while the engine's pass runs).
struct StoppedTree {
    std::unique_ptr<SuffixTree> tree;
    void release() {
        py::gil_scoped_release unlocked;
        tree.reset();
    }
};

// CPU the builder threads spent building prompt trees, in this process
std::atomic<int64_t> build_cpu_ns{0};

// Threads that build prompt trees off the caller's thread, one pool per process, of the size its
// first user asks for (made again in a forked child, whose copy of the parent's threads does not
// run). A build needs no GIL: it runs while the drafter's Python goes on with the step's other rows.
class Builders {
public:
    static Builders& get(int threads) {
        static std::mutex made;
        static Builders* pool = nullptr;
        std::lock_guard<std::mutex> lock(made);
        if (pool == nullptr || pool->pid_ != getpid()) pool = new Builders(threads);  // a fork's: leaked
        return *pool;
    }

    std::future<std::unique_ptr<SuffixTree>> build(int depth, std::vector<int32_t> tokens) {
        auto task = std::make_shared<std::packaged_task<std::unique_ptr<SuffixTree>()>>(
            [depth, tokens = std::move(tokens)]() {
                timespec t0{}, t1{};
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
                auto tree = std::make_unique<SuffixTree>(depth);
                tree->extend(0, tokens);
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
                build_cpu_ns += (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
                return tree;
            });
        auto done = task->get_future();
        {
            std::lock_guard<std::mutex> lock(state_->mutex);
            state_->tasks.emplace_back([task]() { (*task)(); });
        }
        state_->ready.notify_one();
        return done;
    }

private:
    struct State {
        std::mutex mutex;
        std::condition_variable ready;
        std::deque<std::function<void()>> tasks;
    };

    explicit Builders(int threads) : pid_(getpid()), state_(std::make_shared<State>()) {
        for (int i = 0; i < threads; i++) {
            std::thread([state = state_]() {
                while (true) {
                    std::function<void()> task;
                    {
                        std::unique_lock<std::mutex> lock(state->mutex);
                        state->ready.wait(lock, [&] { return !state->tasks.empty(); });
                        task = std::move(state->tasks.front());
                        state->tasks.pop_front();
                    }
                    task();
                }
            }).detach();
        }
    }

    pid_t pid_;
    std::shared_ptr<State> state_;
};

}  // namespace

std::pair<Draft, Draft> SuffixTree::speculate_two(std::span<const int32_t> context,
                                                  int max_spec_tokens, float factor_a,
                                                  float factor_b, float min_token_prob) {
    Draft best_a, best_b;
    for (int match_len = 1; match_len < static_cast<int>(context.size()); match_len++) {
        auto [node, idx] = _match_context(
            context.subspan(context.size() - match_len, match_len));
        if (node == nullptr) break;
        int cap_a = cap_of(max_spec_tokens, match_len, factor_a);
        int cap_b = cap_of(max_spec_tokens, match_len, factor_b);
        // a path draft capped at fewer tokens is the first tokens of the longer one
        Draft path = _speculate_path(node, idx, std::max(cap_a, cap_b), min_token_prob);
        keep_if_better(best_a, path, cap_a, match_len);
        keep_if_better(best_b, path, cap_b, match_len);
    }
    return {std::move(best_a), std::move(best_b)};
}

class Forest {
public:
    // `build_threads` > 0: prompt trees of `min_built` tokens or more are built on that many threads
    // (one pool per process), the calls that need the tree wait for it.
    Forest(int depth, int max_cached, int build_threads, int min_built)
        : depth_(depth), max_cached_(max_cached), build_threads_(build_threads),
          min_built_(min_built), global_(depth) {}

    // A new request `key`: a prompt tree over `history` but for its last `response` tokens, which
    // are added as its response (SuffixDecodingCache.start_request, then add_active_response); its
    // place in the global tree waits for its row in the next `step` where `defer`.
    void start(int64_t key, const Tokens& history, int response, bool defer) {
        if (active(key)) throw py::value_error("suffix trees: row key already active");
        auto all = span_of(history);
        size_t split = all.size() - std::min(static_cast<size_t>(std::max(response, 0)), all.size());
        auto prompt = all.first(split);
        if (build_threads_ > 0 && prompt.size() >= static_cast<size_t>(min_built_)) {
            building_[key] = Builders::get(build_threads_).build(
                depth_, std::vector<int32_t>(prompt.begin(), prompt.end()));
        } else {
            auto tree = std::make_unique<SuffixTree>(depth_);
            tree->extend(0, prompt);
            local_[key] = std::move(tree);
        }
        auto rest = all.subspan(split);
        pending_[key].assign(rest.begin(), rest.end());
        if (!defer) {
            built(key);
            attach(key);
        }
    }

    // Request `new_key` continues `old_key` (its history is old_key's followed by `tokens`):
    // old_key's prompt tree, extended by `tokens` but their last `response`, becomes new_key's;
    // old_key's response stays cached in the global tree. `defer`: as `start`'s.
    void adopt(int64_t old_key, int64_t new_key, const Tokens& tokens, int response, bool defer) {
        built(old_key);
        auto it = local_.find(old_key);
        if (it == local_.end()) throw py::key_error("suffix trees: no active row to continue");
        if (active(new_key)) throw py::value_error("suffix trees: row key already active");
        attach(old_key);
        std::unique_ptr<SuffixTree> tree = std::move(it->second);
        local_.erase(it);
        auto all = span_of(tokens);
        size_t split = all.size() - std::min(static_cast<size_t>(std::max(response, 0)), all.size());
        if (split) tree->extend(0, all.first(split));
        local_[new_key] = std::move(tree);
        auto rest = all.subspan(split);
        pending_[new_key].assign(rest.begin(), rest.end());
        if (!defer) attach(new_key);
    }

    // The request is done: its prompt tree leaves the forest (returned for the caller to free, None
    // when `key` is not active); its response stays in the global tree.
    py::object stop(int64_t key) {
        built(key);
        attach(key);
        auto it = local_.find(key);
        if (it == local_.end()) return py::none();
        auto out = std::make_unique<StoppedTree>();
        out->tree = std::move(it->second);
        local_.erase(it);
        return py::cast(std::move(out));
    }

    bool active(int64_t key) const { return local_.count(key) > 0 || building_.count(key) > 0; }
    size_t num_active() const { return local_.size() + building_.size(); }
    static double build_cpu_seconds() { return build_cpu_ns.load() / 1e9; }
    size_t num_cached() const { return req_to_seq_.size(); }

    // A step's rows, in batch order, each (key, new tokens, history, what, max tokens, spec factor,
    // probability floor, extension factor): the row takes its place in the global tree if it is
    // new, its new tokens go into both trees, then `what` = 0 drafts nothing (None), 1 drafts with
    // the extension (`drafted`), 2 as the cache's speculate (`speculated`).
    py::list step(const py::list& rows) {
        py::list out;
        for (const py::handle& item : rows) {
            auto row = item.cast<py::tuple>();
            int64_t key = row[0].cast<int64_t>();
            built(key);
            attach(key);
            auto fresh = row[1].cast<Tokens>();
            add(key, span_of(fresh));
            int what = row[3].cast<int>();
            if (what == 0) {
                out.append(py::none());
                continue;
            }
            auto history = row[2].cast<Tokens>();
            int max_tokens = row[4].cast<int>();
            double factor = row[5].cast<double>(), min_prob = row[6].cast<double>();
            if (what == 1)
                out.append(drafted(key, span_of(history), max_tokens, factor, min_prob,
                                   row[7].cast<double>()));
            else
                out.append(speculated(key, span_of(history), max_tokens, factor, min_prob));
        }
        return out;
    }

private:
    std::span<const int32_t> context_of(std::span<const int32_t> all) const {
        return all.last(std::min(all.size(), static_cast<size_t>(depth_)));
    }

    // SuffixDecodingCache.speculate on the last `depth` tokens of `history` (path speculation,
    // offset 0): (tokens, confidences); nothing for a row that is not active.
    py::tuple speculated(int64_t key, std::span<const int32_t> history, int max_tokens,
                         double factor, double min_prob) {
        py::list tokens, confs;
        auto it = local_.find(key);
        if (it != local_.end() && max_tokens > 0) {
            auto ctx = context_of(history);
            float f = static_cast<float>(factor), p = static_cast<float>(min_prob);
            Draft mine = it->second->speculate(ctx, max_tokens, f, 0.0f, p, false);
            Draft shared = global_.speculate(ctx, max_tokens, f, 0.0f, p, false);
            tokens_and_confidences(higher(mine, shared), 0, tokens, confs);
        }
        return py::make_tuple(tokens, confs);
    }

    // `speculated` at `factor` and, where `extend_factor` exceeds it, what the draft at
    // `extend_factor` holds past that draft: (tokens, confidences, more tokens, their confidences).
    // No extension where the first draft fills `max_tokens`, where there is none at a factor of 1 or
    // more (neither tree matched or was confident), or where the longer draft does not begin with
    // the first (the trees preferred another match there).
    py::tuple drafted(int64_t key, std::span<const int32_t> history, int max_tokens, double factor,
                      double min_prob, double extend_factor) {
        bool extending = extend_factor > 0 && extend_factor > factor;
        if (!extending) {
            py::tuple base = speculated(key, history, max_tokens, factor, min_prob);
            return py::make_tuple(base[0], base[1], py::list(), py::list());
        }
        py::list tokens, confs, more, more_confs;
        auto it = local_.find(key);
        if (it == local_.end() || max_tokens <= 0)
            return py::make_tuple(tokens, confs, more, more_confs);
        auto ctx = context_of(history);
        float f = static_cast<float>(factor), fe = static_cast<float>(extend_factor);
        float p = static_cast<float>(min_prob);
        auto [mine, mine_long] = it->second->speculate_two(ctx, max_tokens, f, fe, p);
        auto [shared, shared_long] = global_.speculate_two(ctx, max_tokens, f, fe, p);
        const Draft& base = higher(mine, shared);
        tokens_and_confidences(base, 0, tokens, confs);
        size_t n = base.token_ids.size();
        const Draft& longer = higher(mine_long, shared_long);
        bool grows = n < static_cast<size_t>(max_tokens) && (n > 0 || factor < 1) &&
                     longer.token_ids.size() > n &&
                     std::equal(base.token_ids.begin(), base.token_ids.end(),
                                longer.token_ids.begin());
        if (grows) tokens_and_confidences(longer, n, more, more_confs);
        return py::make_tuple(tokens, confs, more, more_confs);
    }

    // The request's prompt tree, where a builder thread is building it: waited for without the GIL.
    void built(int64_t key) {
        auto it = building_.find(key);
        if (it == building_.end()) return;
        std::unique_ptr<SuffixTree> tree;
        {
            py::gil_scoped_release unlocked;
            tree = it->second.get();
        }
        building_.erase(it);
        local_[key] = std::move(tree);
    }

    // A started or continued request's place in the global tree, where it waits for one: its
    // sequence id (SuffixDecodingCache.start_request) and its first response tokens.
    void attach(int64_t key) {
        auto it = pending_.find(key);
        if (it == pending_.end()) return;
        std::vector<int32_t> response = std::move(it->second);
        pending_.erase(it);
        if (!local_.count(key)) return;
        if (max_cached_ != 0) allocate(key);
        add(key, response);
    }

    // add_active_response: the prompt tree and, where the request has one, its global sequence
    void add(int64_t key, std::span<const int32_t> tokens) {
        if (tokens.empty()) return;
        auto it = local_.find(key);
        if (it == local_.end()) return;
        it->second->extend(0, tokens);
        auto seq = req_to_seq_.find(key);
        if (seq != req_to_seq_.end()) global_.extend(seq->second, tokens);
    }

    // SuffixDecodingCache._generate_seq_id and _maybe_evict_requests. Keys are allocated in
    // increasing order, so the map's key order is the cache's insertion (FIFO) order.
    void allocate(int64_t key) {
        int seq;
        while (true) {
            seq = next_seq_;
            next_seq_ = (next_seq_ + 1) & 0x7FFFFFFF;
            auto used = seq_to_req_.find(seq);
            if (used == seq_to_req_.end() || !local_.count(used->second)) break;
        }
        auto used = seq_to_req_.find(seq);
        if (used != seq_to_req_.end()) evict(used->second);
        req_to_seq_[key] = seq;
        seq_to_req_[seq] = key;
        if (max_cached_ < 0) return;
        while (static_cast<int64_t>(req_to_seq_.size()) > max_cached_) {
            for (auto& [req, s] : req_to_seq_) {
                if (s != seq) {
                    evict(req);
                    break;
                }
            }
        }
    }

    void evict(int64_t req) {
        auto it = req_to_seq_.find(req);
        int seq = it->second;
        req_to_seq_.erase(it);
        seq_to_req_.erase(seq);
        global_.remove(seq);
    }

    int depth_;
    int64_t max_cached_;
    int build_threads_;
    int min_built_;
    std::unordered_map<int64_t, std::future<std::unique_ptr<SuffixTree>>> building_;
    SuffixTree global_;
    std::unordered_map<int64_t, std::unique_ptr<SuffixTree>> local_;
    std::unordered_map<int64_t, std::vector<int32_t>> pending_;  // waiting for `attach`
    std::map<int64_t, int> req_to_seq_;
    std::unordered_map<int, int64_t> seq_to_req_;
    int next_seq_ = 0;
};

PYBIND11_MODULE(_trees, m) {
    m.doc() = "arctic-inference's suffix trees as the structure drafter drives them (csrc/suffix_trees)";
    py::class_<StoppedTree>(m, "StoppedTree").def("release", &StoppedTree::release);
    py::class_<Forest>(m, "Forest")
        .def(py::init<int, int, int, int>(), py::arg("depth"), py::arg("max_cached"),
             py::arg("build_threads") = 0, py::arg("min_built") = 0)
        .def_static("build_cpu_seconds", &Forest::build_cpu_seconds)
        .def("start", &Forest::start)
        .def("adopt", &Forest::adopt)
        .def("stop", &Forest::stop)
        .def("active", &Forest::active)
        .def("num_active", &Forest::num_active)
        .def("num_cached", &Forest::num_cached)
        .def("step", &Forest::step);
}
