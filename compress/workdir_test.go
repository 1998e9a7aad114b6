package compress

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// mkEntries creates, under dir, the files and (names ending in "/")
// directories listed, each directory with one file inside.
func mkEntries(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		p := filepath.Join(dir, strings.TrimSuffix(n, "/"))
		if strings.HasSuffix(n, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			p = filepath.Join(p, "part.safetensors")
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

const key24 = "0123456789abcdef01234567"

// TestRemoveStaleOwnOnly: removeStale removes the temporary directories
// of this pipeline's stages ("." + stage + "-" + 24 hex digits +
// ".tmp-" + digits) and nothing else: other jobs' temporaries (another
// WriteDir's .qq.tmp-77, an artifact's .important.lmpk.tmp-123), stage
// directories, the lock and the marker stay.
func TestRemoveStaleOwnOnly(t *testing.T) {
	dir := t.TempDir()
	mkEntries(t, dir, ".calibrate-"+key24+".tmp-5/", ".quantize-weights-"+key24+".tmp-123456/",
		".qq.tmp-77/", ".important.lmpk.tmp-123", ".calibrate-0123.tmp-9/", ".calibrate-"+key24+".tmp-x/",
		"eval-"+key24+"/", "lock", workMarker)
	if err := removeStale(dir); err != nil {
		t.Fatal(err)
	}
	want := []string{".calibrate-0123.tmp-9", ".calibrate-" + key24 + ".tmp-x", ".important.lmpk.tmp-123", ".qq.tmp-77", "eval-" + key24, "lmpack-work-dir", "lock"}
	if got := dirNames(t, dir); !slices.Equal(got, want) {
		t.Errorf("after removeStale: %v, want %v (only the two stage temporaries removed)", got, want)
	}
}

// TestWorkDirRefusesForeign: Run refuses, before anything is written or
// removed, a work directory that is not empty, has no lmpack-work-dir
// marker and holds files a work directory does not hold; the error names
// the directory, the marker and the first foreign file. The files keep their bytes.
func TestWorkDirRefusesForeign(t *testing.T) {
	dir := t.TempDir()
	work := filepath.Join(dir, "mine")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	mkEntries(t, work, ".important.lmpk.tmp-123", ".calibrate-"+key24+".tmp-5/", "notes.txt")
	_, err := Run(t.Context(), testOptions(t, mustRecipe(t, smallRecipe), filepath.Join(dir, "out.lmpk"), work))
	if err == nil || !strings.Contains(err.Error(), work) || !strings.Contains(err.Error(), "not an lmpack work directory") ||
		!strings.Contains(err.Error(), workMarker) || !strings.Contains(err.Error(), `".important.lmpk.tmp-123"`) {
		t.Errorf("foreign work dir: %v, want a refusal naming %s, %s and its first foreign file", err, work, workMarker)
	}
	want := []string{".calibrate-" + key24 + ".tmp-5", ".important.lmpk.tmp-123", "notes.txt"}
	if got := dirNames(t, work); !slices.Equal(got, want) {
		t.Errorf("refused work dir holds %v, want it untouched %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "out.lmpk")); !os.IsNotExist(err) {
		t.Errorf("output written: %v", err)
	}
}

// TestPrepareWorkDir: a missing directory is created, an empty one, one
// with the marker (whatever else it holds) and one that holds only what
// an unmarked work directory of an older lmpack held (lock, stage
// directories, their temporaries) are accepted and get the marker; a
// file and a directory of other files are refused, naming them.
func TestPrepareWorkDir(t *testing.T) {
	root := t.TempDir()
	ok := func(name string, entries ...string) {
		t.Helper()
		d := filepath.Join(root, name)
		mkEntries(t, root, entries...)
		if err := prepareWorkDir(d); err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if err := markWorkDir(d); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(d, workMarker))
		if err != nil || name != "marked" && !strings.Contains(string(b), "lmpack compress") {
			t.Errorf("%s: marker %q, %v", name, b, err)
		}
	}
	ok(filepath.Join("new", "nested"))
	if err := os.Mkdir(filepath.Join(root, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	ok("empty")
	ok("marked", "marked/"+workMarker, "marked/x.txt")
	ok("older", "older/lock", "older/calibrate-"+key24+"/", "older/.pack-"+key24+".tmp-42/")
	if err := os.WriteFile(filepath.Join(root, "file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"file": "is a file, not a directory", "foreign": `holds "a.lmpk"`} {
		if name == "foreign" {
			mkEntries(t, root, "foreign/", "foreign/lock", "foreign/a.lmpk")
		}
		err := prepareWorkDir(filepath.Join(root, name))
		if err == nil || !strings.Contains(err.Error(), filepath.Join(root, name)) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming it with %q", name, err, want)
		}
	}
}
