// The structure drafter's in-segment lookup (agentspec_sdk.drafting._lookup): the longest suffix of
// the text typed so far that occurs in earlier text, and what followed it there. Matching is on
// characters (Python's code points), so the answers are those of Python's str operations:
//
//   longest_match(query, corpus, end, min_k, max_k, start=0)  the longest suffix of `query` (min_k..max_k
//       characters) in corpus[start:end], its most recent occurrence; binary search over the length
//       (a k-suffix occurs wherever a longer one does), each probe a reverse search (str.rfind);
//   CorpusIndex  append-only text indexed by its SHORT- and LONG-character grams: per gram length one
//       sorted array of 64-bit entries, a gram's 32-bit key above the end offset of one occurrence, so
//       one key's occurrences are contiguous and in text order; a search examines at most CAP of the
//       most recent occurrences of the query's last LONG characters (matches of LONG or more), else
//       of its last SHORT. Exact unless a key has more than CAP occurrences. Text appended after a
//       build (up to DIRECT characters) is searched as a string; a longer tail is indexed by merging
//       its grams into the tables (the tables are never changed in place: an index that took them
//       over from a shorter text, `extending`, keeps its own);
//   continuation(query, corpora, ...)  the best match over several corpora (str or CorpusIndex) and the
//       text after it, up to a NUL separator.
//
// The keys: 3 characters are exact (21 bits each), 8 a polynomial hash mod 2^64; a key is the high
// half of that code times a Fibonacci constant. `work()` counts what the searches may scan and the
// index entries they examine (tests check that a step's work does not grow with the context).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace {

using Text = std::u32string;
using Match = std::pair<int64_t, int64_t>;  // (length, position); (0, -1): none

constexpr int SHORT = 3, LONG = 8;
constexpr uint64_t PRIME = 0x100000001B3ULL;
constexpr uint64_t MIX = 0x9E3779B97F4A7C15ULL;
constexpr int64_t MAX_OFFSET = int64_t{1} << 32;
constexpr uint64_t OFFSET_MASK = (uint64_t{1} << 32) - 1;
constexpr char32_t SEPARATOR = U'\0';

// class settings (tests change them: the index even for short texts, every gram on one key)
int64_t direct = 4096;  // up to this many characters a string search is cheaper than the index
int64_t cap = 48;
uint64_t key_mask = OFFSET_MASK;
// process-wide work counters: characters a string search may scan, index entries examined
int64_t scanned = 0, examined = 0;

Text text_of(py::handle obj) {
    PyObject* s = obj.ptr();
    if (!PyUnicode_Check(s)) throw py::type_error("lookup: a text must be a str");
    const Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    const int kind = PyUnicode_KIND(s);
    const void* data = PyUnicode_DATA(s);
    Text out(static_cast<size_t>(n), U'\0');
    for (Py_ssize_t i = 0; i < n; i++) out[i] = static_cast<char32_t>(PyUnicode_READ(kind, data, i));
    return out;
}

py::str str_of(const char32_t* data, size_t n) {
    PyObject* s = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, data, static_cast<Py_ssize_t>(n));
    if (s == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(s);
}

// `_gram_codes` of the gram at `p` (exact for SHORT characters, else the polynomial hash)
uint64_t gram_code(const char32_t* p, int gram) {
    if (gram == 3)
        return (uint64_t{p[0]} << 42) | (uint64_t{p[1]} << 21) | uint64_t{p[2]};
    uint64_t h = 0;
    for (int j = 0; j < gram; j++) h = h * PRIME + uint64_t{p[j]};
    return h;
}

uint64_t gram_key(const char32_t* p, int gram) {
    return ((gram_code(p, gram) * MIX) >> 32) & key_mask;
}

// Python's str.rfind(sub, start, end) over t: the highest i, start <= i, i + len(sub) <= end
int64_t rfind(const Text& t, const char32_t* sub, int64_t sn, int64_t start, int64_t end) {
    const int64_t n = static_cast<int64_t>(t.size());
    if (end > n) end = n;
    else if (end < 0) end = std::max<int64_t>(end + n, 0);
    if (start < 0) start = std::max<int64_t>(start + n, 0);
    if (end - start < sn) return -1;
    if (sn == 0) return end;
    const char32_t last = sub[sn - 1];
    for (int64_t i = end - sn; i >= start; i--) {
        if (t[i + sn - 1] != last) continue;
        if (std::equal(sub, sub + sn - 1, t.data() + i)) return i;
    }
    return -1;
}

// query[-k:] as Python slices it (k 0: the whole query)
const char32_t* suffix(const Text& q, int64_t k) {
    return k == 0 ? q.data() : q.data() + q.size() - k;
}

int64_t suffix_len(const Text& q, int64_t k) {
    return k == 0 ? static_cast<int64_t>(q.size()) : k;
}

Match string_match(const Text& query, const Text& corpus, int64_t end, int64_t min_k, int64_t max_k,
                   int64_t start = 0) {
    scanned += std::max<int64_t>(0, end - start);
    max_k = std::min<int64_t>(max_k, static_cast<int64_t>(query.size()));
    if (max_k < min_k || end <= 0) return {0, -1};
    int64_t pos = rfind(corpus, suffix(query, min_k), suffix_len(query, min_k), start, end);
    if (pos < 0) return {0, -1};
    int64_t best_k = min_k, best_pos = pos;
    int64_t lo = min_k + 1, hi = max_k;
    while (lo <= hi) {
        int64_t mid = (lo + hi) / 2;
        int64_t p = rfind(corpus, suffix(query, mid), mid, start, end);
        if (p >= 0) {
            best_k = mid;
            best_pos = p;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return {best_k, best_pos};
}

// Sorts entries made in increasing end order by their key (the high half), keeping that order among
// equal keys: the entries end sorted, as one sort of the whole values would leave them (an LSD radix
// sort, three passes of 11 bits: a 16k-character index built 6-9x faster than with std::sort).
void sort_by_key(std::vector<uint64_t>& entries) {
    constexpr int BITS = 11, BUCKETS = 1 << BITS;
    std::vector<uint64_t> other(entries.size());
    std::vector<size_t> count(BUCKETS);
    for (int shift = 32; shift < 64; shift += BITS) {
        std::fill(count.begin(), count.end(), 0);
        for (uint64_t e : entries) count[(e >> shift) & (BUCKETS - 1)]++;
        if (count[(entries.front() >> shift) & (BUCKETS - 1)] == entries.size()) continue;  // one digit
        size_t at = 0;
        for (auto& c : count) {
            const size_t n = c;
            c = at;
            at += n;
        }
        for (uint64_t e : entries) other[count[(e >> shift) & (BUCKETS - 1)]++] = e;
        entries.swap(other);
    }
}

struct Tables {
    std::vector<uint64_t> grams[2];  // SHORT, LONG
};

class CorpusIndex {
public:
    explicit CorpusIndex(Text text = Text()) : text_(std::move(text)) {}

    size_t size() const { return text_.size(); }
    const Text& text() const { return text_; }

    void extend(const Text& piece) { text_ += piece; }

    // The index built now where searches will use it (a row's corpora when the row enters the batch).
    void prepare() {
        const int64_t n = static_cast<int64_t>(text_.size());
        if (direct < n && n < MAX_OFFSET && (!tables_ || indexed_ < n)) build();
    }

    // An index over `text` that takes over `base`'s tables where the text `base` indexed begins `text`.
    static CorpusIndex extending(const CorpusIndex& base, Text text) {
        CorpusIndex out(std::move(text));
        const size_t indexed = static_cast<size_t>(base.indexed_);
        if (base.tables_ && indexed <= out.text_.size() &&
            out.text_.compare(0, indexed, base.text_, 0, indexed) == 0) {
            out.tables_ = base.tables_;
            out.indexed_ = base.indexed_;
        }
        return out;
    }

    Match longest_match(const Text& query, int64_t end, int64_t min_k, int64_t max_k) {
        max_k = std::min<int64_t>(max_k, static_cast<int64_t>(query.size()));
        if (max_k < min_k || end <= 0) return {0, -1};
        const int64_t n = static_cast<int64_t>(text_.size());
        if (min_k < SHORT || !(direct < n && n < MAX_OFFSET))
            return string_match(query, text_, end, min_k, max_k);
        if (!tables_ || n - indexed_ > direct) build();
        Match best = indexed_match(query, std::min(end, indexed_), min_k, max_k);
        if (end > indexed_) {  // the text appended since the build: a bounded string search, which
            // also sees matches that begin in the indexed text; on equal length it is the more recent
            Match tail = string_match(query, text_, end, min_k, max_k,
                                      std::max<int64_t>(0, indexed_ - max_k));
            if (tail.first && tail.first >= best.first) return tail;
        }
        return best;
    }

    py::object tables() const {
        if (!tables_) return py::none();
        py::dict out;
        const int grams[2] = {SHORT, LONG};
        for (int g = 0; g < 2; g++) {
            const auto& v = tables_->grams[g];
            out[py::int_(grams[g])] = py::array_t<uint64_t>(static_cast<py::ssize_t>(v.size()), v.data());
        }
        return out;
    }

    int64_t checked = 0;  // index entries examined by this index's searches
    int64_t builds = 0;   // times its tables were (re)built

private:
    void build() {
        const int64_t n = static_cast<int64_t>(text_.size());
        const int64_t start = tables_ ? indexed_ : 0;
        auto made = std::make_shared<Tables>();
        const int grams[2] = {SHORT, LONG};
        for (int g = 0; g < 2; g++) {
            const int gram = grams[g];
            const int64_t first = std::max<int64_t>(0, start - gram + 1);  // the earliest window ending after start
            std::vector<uint64_t> fresh;
            if (n - first >= gram) {
                fresh.resize(static_cast<size_t>(n - first - gram + 1));
                const char32_t* t = text_.data();
                if (gram == SHORT) {
                    for (int64_t i = first; i + gram <= n; i++)
                        fresh[i - first] = (gram_key(t + i, gram) << 32) | static_cast<uint64_t>(i + gram);
                } else {  // the polynomial hash rolled along the text (mod 2^64, as gram_code sums it)
                    uint64_t top = 1;  // PRIME^(gram-1)
                    for (int j = 1; j < gram; j++) top *= PRIME;
                    uint64_t h = gram_code(t + first, gram);
                    for (int64_t i = first;; i++) {
                        fresh[i - first] = ((((h * MIX) >> 32) & key_mask) << 32) | static_cast<uint64_t>(i + gram);
                        if (i + gram >= n) break;
                        h = (h - uint64_t{t[i]} * top) * PRIME + uint64_t{t[i + gram]};
                    }
                }
                sort_by_key(fresh);
            }
            auto& table = made->grams[g];
            if (tables_ && !tables_->grams[g].empty()) {
                const auto& kept = tables_->grams[g];
                table.resize(kept.size() + fresh.size());
                std::merge(kept.begin(), kept.end(), fresh.begin(), fresh.end(), table.begin());
            } else {
                table = std::move(fresh);
            }
        }
        tables_ = std::move(made);
        indexed_ = n;
        builds++;
    }

    Match indexed_match(const Text& query, int64_t end, int64_t min_k, int64_t max_k) {
        if (end <= 0) return {0, -1};
        std::pair<int64_t, int64_t> best{0, -1};  // (length, end of the match)
        if (max_k >= LONG) best = best_of(1, query, end, LONG, max_k);
        if (best.first == 0) best = best_of(0, query, end, min_k, std::min<int64_t>(max_k, LONG - 1));
        if (best.first == 0) return {0, -1};
        return {best.first, best.second - best.first};
    }

    // The longest match among the most recent CAP occurrences (at most `end`) of the query's last
    // gram, latest first: (length, its end).
    std::pair<int64_t, int64_t> best_of(int g, const Text& query, int64_t end, int64_t min_k, int64_t max_k) {
        const int gram = g == 0 ? SHORT : LONG;
        const auto& table = tables_->grams[g];
        const uint64_t base = gram_key(query.data() + query.size() - gram, gram) << 32;
        auto lo = std::lower_bound(table.begin(), table.end(), base);
        auto stop = std::upper_bound(lo, table.end(), base | static_cast<uint64_t>(end));
        if (lo >= stop) return {0, -1};
        if (stop - lo > cap) lo = stop - cap;
        const int64_t qn = static_cast<int64_t>(query.size());
        const char32_t* q = query.data();
        const char32_t* t = text_.data();
        auto same = [&](int64_t e, int64_t k) { return std::equal(t + e - k, t + e, q + qn - k); };
        int64_t best_k = 0, best_e = -1, seen = 0;
        for (auto it = stop; it != lo;) {
            --it;
            if (best_k >= max_k) break;
            seen++;
            const int64_t e = static_cast<int64_t>(*it & OFFSET_MASK);
            const int64_t want = std::max(best_k + 1, min_k);  // no longer than the best so far loses to it
            if (want > e || !same(e, want)) continue;
            int64_t a = want, b = std::min(max_k, e);  // text[e-a:e] matches; the longest by bisection
            while (a < b) {
                const int64_t mid = (a + b + 1) / 2;
                if (same(e, mid)) a = mid;
                else b = mid - 1;
            }
            best_k = a;
            best_e = e;
        }
        checked += seen;
        examined += seen;
        return {best_k, best_e};
    }

    Text text_;
    std::shared_ptr<const Tables> tables_;  // null: not built
    int64_t indexed_ = 0;                   // the tables cover text_[:indexed_]
};

py::tuple continuation(py::str query, py::sequence corpora, int64_t min_chars, int64_t max_match,
                       int64_t max_chars, int64_t follow_chars) {
    const Text q = text_of(query);
    std::vector<Text> held;  // the str corpora converted (the best one is read after the loop)
    held.reserve(py::len(corpora));
    const Text* best_text = nullptr;
    int64_t best_k = 0, best_pos = -1;
    for (py::handle pair : corpora) {
        auto item = py::reinterpret_borrow<py::sequence>(pair);
        py::object corpus = item[0];
        const int64_t end = item[1].cast<int64_t>();
        Match m;
        const Text* text;
        if (py::isinstance<CorpusIndex>(corpus)) {
            CorpusIndex& index = corpus.cast<CorpusIndex&>();
            m = index.longest_match(q, end, min_chars, max_match);
            text = &index.text();
        } else {
            if (corpus.ptr() == query.ptr()) {
                text = &q;
            } else {
                held.push_back(text_of(corpus));
                text = &held.back();
            }
            m = string_match(q, *text, end, min_chars, max_match);
        }
        if (m.first > best_k) {
            best_k = m.first;
            best_pos = m.second;
            best_text = text;
        }
    }
    if (best_k == 0) return py::make_tuple(py::str(""), py::str(""), 0);
    const Text& t = *best_text;
    const size_t from = std::min(static_cast<size_t>(best_pos + best_k), t.size());
    size_t to = std::min(t.size(), from + static_cast<size_t>(std::max<int64_t>(0, max_chars + follow_chars)));
    const size_t cut = t.find(SEPARATOR, from);
    if (cut != Text::npos && cut < to) to = cut;
    const size_t split = std::min(to, from + static_cast<size_t>(std::max<int64_t>(0, max_chars)));
    return py::make_tuple(str_of(t.data() + from, split - from), str_of(t.data() + split, to - split), best_k);
}

}  // namespace

PYBIND11_MODULE(_lookup, m) {
    m.doc() = "In-segment lookup: longest suffix matches over texts and gram-indexed corpora (csrc/lookup).";

    py::class_<CorpusIndex> index(m, "CorpusIndex");
    index.def(py::init([](py::str text) { return CorpusIndex(text_of(text)); }), py::arg("text") = py::str(""))
        .def("__len__", &CorpusIndex::size)
        .def_property_readonly("text", [](const CorpusIndex& c) { return str_of(c.text().data(), c.size()); })
        .def("extend", [](CorpusIndex& c, py::str piece) { c.extend(text_of(piece)); })
        .def("prepare", &CorpusIndex::prepare)
        .def_static("extending", [](const CorpusIndex& base, py::str text) {
            return CorpusIndex::extending(base, text_of(text));
        })
        .def("longest_match", [](CorpusIndex& c, py::str query, int64_t end, int64_t min_k, int64_t max_k) {
            return c.longest_match(text_of(query), end, min_k, max_k);
        })
        .def_property_readonly("tables", &CorpusIndex::tables)
        .def_readonly("checked", &CorpusIndex::checked)
        .def_readonly("builds", &CorpusIndex::builds)
        .def_property_static("DIRECT", [](py::object) { return direct; },
                             [](py::object, int64_t v) { direct = v; })
        .def_property_static("CAP", [](py::object) { return cap; },
                             [](py::object, int64_t v) { cap = v; })
        .def_property_static("KEY_MASK", [](py::object) { return key_mask; },
                             [](py::object, uint64_t v) { key_mask = v & OFFSET_MASK; });
    index.attr("SHORT") = SHORT;
    index.attr("LONG") = LONG;

    m.def("longest_match", [](py::str query, py::str corpus, int64_t end, int64_t min_k, int64_t max_k,
                              int64_t start) {
        return string_match(text_of(query), text_of(corpus), end, min_k, max_k, start);
    }, py::arg("query"), py::arg("corpus"), py::arg("end"), py::arg("min_k"), py::arg("max_k"),
       py::arg("start") = 0);
    m.def("continuation", &continuation, py::arg("query"), py::arg("corpora"), py::kw_only(),
          py::arg("min_chars") = 3, py::arg("max_match") = 64, py::arg("max_chars") = 64,
          py::arg("follow_chars") = 8);
    m.def("work", []() { return py::make_tuple(scanned, examined); },
          "(characters the string searches may have scanned, index entries examined) in this process");
    m.def("gram_key", [](py::str gram) {
        Text t = text_of(gram);
        return gram_key(t.data(), static_cast<int>(t.size()));
    }, "The 32-bit key of one gram (its code times the mixing constant, the high half).");
}
