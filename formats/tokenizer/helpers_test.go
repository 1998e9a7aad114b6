package tokenizer

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// Loading Qwen3 (11 MB of JSON) takes a while; tests share one instance.
var (
	qwenOnce sync.Once
	qwenTok  *Tokenizer
	qwenErr  error
	llamaMu  sync.Mutex
	llamaTok *Tokenizer
)

func storiesTokenizer(tb testing.TB) *Tokenizer {
	tb.Helper()
	llamaMu.Lock()
	defer llamaMu.Unlock()
	if llamaTok == nil {
		t, err := Load(shared.Path(tb, "stories260K-hf"))
		if err != nil {
			tb.Fatal(err)
		}
		llamaTok = t
	}
	return llamaTok
}

func qwenTokenizer(tb testing.TB) *Tokenizer {
	tb.Helper()
	dir := shared.Path(tb, "qwen3-tokenizer")
	qwenOnce.Do(func() { qwenTok, qwenErr = Load(filepath.Join(dir, "tokenizer.json.gz")) })
	if qwenErr != nil {
		tb.Fatal(qwenErr)
	}
	return qwenTok
}

func readShared(tb testing.TB, rel ...string) []byte {
	tb.Helper()
	b, err := os.ReadFile(shared.Path(tb, rel...))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func readU16(tb testing.TB, rel ...string) []int {
	b := readShared(tb, rel...)
	if len(b)%2 != 0 {
		tb.Fatalf("%s: odd length %d", filepath.Join(rel...), len(b))
	}
	ids := make([]int, len(b)/2)
	for i := range ids {
		ids[i] = int(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return ids
}

func readJSON(tb testing.TB, v any, rel ...string) {
	tb.Helper()
	if err := json.Unmarshal(readShared(tb, rel...), v); err != nil {
		tb.Fatalf("%s: %v", filepath.Join(rel...), err)
	}
}

// wikiLines returns the non-empty lines of WikiText-2 test (CRLF stripped).
func wikiLines(tb testing.TB) []string {
	raw := string(readShared(tb, "wikitext-2-raw-test", "wiki.test.raw"))
	var out []string
	for _, l := range strings.Split(raw, "\r\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// streamAll decodes ids through a StreamDecoder and concatenates the pieces.
func streamAll(t *Tokenizer, ids []int, skip bool) string {
	d := t.NewStreamDecoder(skip)
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(d.Next(id))
	}
	sb.WriteString(d.Flush())
	return sb.String()
}
