package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// IndexFileName is the index of a sharded Hugging Face checkpoint, mapping
// each tensor to the shard file that holds it.
const IndexFileName = "model.safetensors.index.json"

// SingleFileName is the file name of an unsharded Hugging Face checkpoint.
const SingleFileName = "model.safetensors"

// Checkpoint is a set of safetensors files read as one name space of
// tensors: a sharded checkpoint, a single file, or every .safetensors file of
// a directory. Like File it is safe for concurrent use except Close.
type Checkpoint struct {
	dir    string // directory (or single file) it was opened from, for messages
	files  []*File
	byName map[string]*File
	names  []string
}

// indexJSON is the part of model.safetensors.index.json this package reads.
type indexJSON struct {
	WeightMap map[string]string `json:"weight_map"`
}

// OpenDir opens the checkpoint in dir:
//   - if dir holds model.safetensors.index.json, its "weight_map" (tensor
//     name → shard file name, relative to dir) is authoritative: every shard
//     it names is opened, every tensor it lists must be in its shard, and no
//     shard may hold a tensor the map does not list;
//   - otherwise, if dir holds model.safetensors, just that file;
//   - otherwise every *.safetensors file in dir (a tensor name in two files is
//     an error).
//
// Errors (wrapped): os errors (a shard the index names but dir lacks is
// reported as missing, naming the shard and a tensor it holds, and wraps
// fs.ErrNotExist); errors from Open; ErrFormat naming the index file and
// tensor for an index that is not valid JSON, names a shard outside dir or a
// tensor that is missing, or disagrees with a shard; ErrFormat for a
// duplicated tensor name; ErrNoWeights for a directory with no .safetensors
// file.
func OpenDir(dir string) (*Checkpoint, error) {
	idx := filepath.Join(dir, IndexFileName)
	if _, err := os.Stat(idx); err == nil {
		return openIndexed(dir, idx)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	single := filepath.Join(dir, SingleFileName)
	if _, err := os.Stat(single); err == nil {
		return openFiles(dir, []string{single})
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", dir, err)
	}
	if len(paths) == 0 {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("safetensors: %w", err)
		}
		hint := ""
		if bins, _ := filepath.Glob(filepath.Join(dir, "*.bin")); len(bins) > 0 {
			hint = " (it holds PyTorch .bin files: convert them to safetensors first)"
		}
		return nil, fmt.Errorf("safetensors: %s: %w: want %s, %s or *.safetensors%s", dir, ErrNoWeights, IndexFileName, SingleFileName, hint)
	}
	slices.Sort(paths)
	return openFiles(dir, paths)
}

// OpenPath opens path as a checkpoint: OpenDir when it is a directory,
// otherwise the single safetensors file (Open). Errors: as OpenDir and Open.
func OpenPath(path string) (*Checkpoint, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if st.IsDir() {
		return OpenDir(path)
	}
	return openFiles(path, []string{path})
}

// openFiles opens paths and indexes their tensors, rejecting duplicates.
func openFiles(dir string, paths []string) (*Checkpoint, error) {
	c := &Checkpoint{dir: dir, byName: map[string]*File{}}
	for _, p := range paths {
		f, err := Open(p)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.files = append(c.files, f)
		for _, ti := range f.tensors {
			if prev, dup := c.byName[ti.Name]; dup {
				c.Close()
				return nil, fmt.Errorf("safetensors: %s: tensor %q: in both %s and %s: %w", dir, ti.Name, prev.path, f.path, ErrFormat)
			}
			c.byName[ti.Name] = f
		}
	}
	c.finish()
	return c, nil
}

// openIndexed opens a sharded checkpoint through its index file.
func openIndexed(dir, idx string) (*Checkpoint, error) {
	raw, err := fsx.ReadFile(idx)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	// Reject duplicate tensor names in the weight map, which json.Unmarshal
	// would silently merge.
	var ix indexJSON
	err = forEachMember(bytes.TrimSpace(raw), func(key string, val json.RawMessage) error {
		if key != "weight_map" {
			return nil
		}
		ix.WeightMap = map[string]string{}
		return forEachMember(val, func(name string, v json.RawMessage) error {
			if len(v) == 0 || v[0] != '"' {
				return fmt.Errorf("tensor %q: shard is %s, want a JSON string", name, abbrev(v))
			}
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("tensor %q: %v", name, err)
			}
			ix.WeightMap[name] = s
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: invalid index: %v: %w", idx, err, ErrFormat)
	}
	if ix.WeightMap == nil {
		return nil, fmt.Errorf("safetensors: %s: no \"weight_map\" object: %w", idx, ErrFormat)
	}
	names := make([]string, 0, len(ix.WeightMap))
	for name := range ix.WeightMap {
		names = append(names, name)
	}
	slices.Sort(names)
	var shards []string
	for _, name := range names {
		shard := ix.WeightMap[name]
		if !filepath.IsLocal(shard) || strings.ContainsAny(shard, `/\`) {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: shard %q is not a file name inside the directory: %w", idx, name, shard, ErrFormat)
		}
		shards = append(shards, shard)
	}
	slices.Sort(shards)
	shards = slices.Compact(shards)

	c := &Checkpoint{dir: dir, byName: make(map[string]*File, len(names))}
	byShard := map[string]*File{}
	for _, s := range shards {
		p := filepath.Join(dir, s)
		if _, err := os.Stat(p); err != nil {
			c.Close()
			// Name a tensor that points at the missing shard.
			first, n := "", 0
			for _, name := range names {
				if ix.WeightMap[name] == s {
					if n == 0 {
						first = name
					}
					n++
				}
			}
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("safetensors: %s: shard %s is missing from %s (the index assigns it %d tensor(s), first tensor %q; download the checkpoint again): %w", idx, s, dir, n, first, err)
			}
			return nil, fmt.Errorf("safetensors: %s: shard %s (assigned tensor %q): %w", idx, s, first, err)
		}
		f, err := Open(p)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.files = append(c.files, f)
		byShard[s] = f
	}
	for _, name := range names {
		f := byShard[ix.WeightMap[name]]
		if _, ok := f.index[name]; !ok {
			c.Close()
			return nil, fmt.Errorf("safetensors: %s: tensor %q: listed in shard %s, which does not hold it: %w", idx, name, f.path, ErrFormat)
		}
		c.byName[name] = f
	}
	for _, f := range c.files {
		for _, ti := range f.tensors {
			if c.byName[ti.Name] != f {
				c.Close()
				return nil, fmt.Errorf("safetensors: %s: tensor %q: present in %s but the weight map does not assign it there: %w", idx, ti.Name, f.path, ErrFormat)
			}
		}
	}
	c.finish()
	return c, nil
}

// finish builds the sorted name list.
func (c *Checkpoint) finish() {
	c.names = make([]string, 0, len(c.byName))
	for name := range c.byName {
		c.names = append(c.names, name)
	}
	slices.Sort(c.names)
}

// Dir returns the directory (or, from OpenPath on a file, the file) the
// checkpoint was opened from.
func (c *Checkpoint) Dir() string { return c.dir }

// Names returns all tensor names, sorted. The slice is a copy.
func (c *Checkpoint) Names() []string { return slices.Clone(c.names) }

// Files returns the opened files in path order. The Files belong to the
// Checkpoint; do not Close them individually.
func (c *Checkpoint) Files() []*File { return slices.Clone(c.files) }

// Info returns the header entry of the named tensor and the path of the file
// holding it. Errors: ErrMissingTensor (wrapped, naming the checkpoint
// directory and the tensor).
func (c *Checkpoint) Info(name string) (TensorInfo, string, error) {
	f, ok := c.byName[name]
	if !ok {
		return TensorInfo{}, "", fmt.Errorf("safetensors: %s: tensor %q: %w", c.dir, name, ErrMissingTensor)
	}
	ti, err := f.Info(name)
	return ti, f.path, err
}

// Tensor returns a zero-copy view of the named tensor (see File.Tensor).
// Errors: ErrMissingTensor (wrapped, naming the checkpoint directory and the
// tensor); ErrClosed after Close.
func (c *Checkpoint) Tensor(name string) (*Tensor, error) {
	f, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("safetensors: %s: tensor %q: %w", c.dir, name, ErrMissingTensor)
	}
	return f.Tensor(name)
}

// Close closes every file. Errors: the files' Close errors, joined.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// WriteIndex atomically writes a Hugging Face sharded-checkpoint index to
// path (normally dir/model.safetensors.index.json): {"metadata":
// {"total_size": totalSize}, "weight_map": {tensor: shard file name}}, with
// keys sorted and two-space indentation. totalSize is the summed byte length
// of all tensors (the convention of transformers). Errors: a shard that is
// not a plain file name, I/O errors (the temporary file is removed).
func WriteIndex(path string, totalSize int64, weightMap map[string]string) error {
	for name, shard := range weightMap {
		if !filepath.IsLocal(shard) || strings.ContainsAny(shard, `/\`) {
			return fmt.Errorf("safetensors: %s: tensor %q: shard %q is not a plain file name", path, name, shard)
		}
	}
	doc := struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{map[string]int64{"total_size": totalSize}, weightMap}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil { // map keys are sorted by encoding/json
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if err := fsx.WriteBytes(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return nil
}
