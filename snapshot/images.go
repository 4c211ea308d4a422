package snapshot

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// DirManifest lists the files of a directory image (a runtime's checkpoint: gVisor writes
// checkpoint.img and a tag file), each stored as an image of its own under <name>/<file>.
type DirManifest struct {
	Files []DirFile `json:"files"`
}

// DirFile is one file of a directory image: its name and size in bytes.
type DirFile struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// WriteDir stores every regular file of dir (not its subdirectories) as chunked images under
// name (SPOT-4: zero chunks skipped), then the list of them at <name>/files.json, last: an
// image whose list exists is complete. It returns the summed stats. Errors: dir unreadable,
// or the store's.
func WriteDir(ctx context.Context, bucket *blob.Bucket, name, dir string) (ChunkStats, error) {
	var total ChunkStats
	entries, err := os.ReadDir(dir)
	if err != nil {
		return total, fmt.Errorf("snapshot: %w", err)
	}
	var m DirManifest
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return total, fmt.Errorf("snapshot: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return total, fmt.Errorf("snapshot: %w", err)
		}
		_, s, err := WriteImage(ctx, bucket, path.Join(name, e.Name()), f, st.Size(), DefaultChunkSize)
		f.Close()
		total.add(s)
		if err != nil {
			return total, err
		}
		m.Files = append(m.Files, DirFile{Name: e.Name(), Size: st.Size()})
	}
	b, err := json.Marshal(m)
	if err != nil {
		return total, err
	}
	if err := bucket.WriteAll(ctx, path.Join(name, "files.json"), b, nil); err != nil {
		return total, fmt.Errorf("snapshot: write the file list of %s: %w", name, err)
	}
	return total, nil
}

// ReadDir restores the directory image name into dir (which must exist), fetching only
// non-zero chunks. Errors: no such image (wraps ErrNoImage), a damaged list or file image, or
// the file system's.
func ReadDir(ctx context.Context, bucket *blob.Bucket, name, dir string) (ChunkStats, error) {
	var total ChunkStats
	b, err := bucket.ReadAll(ctx, path.Join(name, "files.json"))
	if gcerrors.Code(err) == gcerrors.NotFound {
		return total, fmt.Errorf("snapshot: image %s: %w", name, ErrNoImage)
	}
	if err != nil {
		return total, fmt.Errorf("snapshot: file list of %s: %w", name, err)
	}
	var m DirManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return total, fmt.Errorf("snapshot: file list of %s is damaged: %w", name, err)
	}
	for _, f := range m.Files {
		if f.Name == "" || f.Name != filepath.Base(f.Name) || f.Name == "." || f.Name == ".." {
			return total, fmt.Errorf("snapshot: file list of %s names %q", name, f.Name)
		}
		out, err := os.OpenFile(filepath.Join(dir, f.Name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return total, fmt.Errorf("snapshot: %w", err)
		}
		_, s, err := ReadImage(ctx, bucket, path.Join(name, f.Name), out)
		total.add(s)
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("snapshot: %w", cerr)
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// DeletePrefix removes every object under prefix (a sandbox's images and chunks: its
// "<id>/"). Errors: the store's.
func DeletePrefix(ctx context.Context, bucket *blob.Bucket, prefix string) error {
	var keys []string
	it := bucket.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("snapshot: list %s: %w", prefix, err)
		}
		keys = append(keys, obj.Key)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := bucket.Delete(ctx, k); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			return fmt.Errorf("snapshot: delete %s: %w", k, err)
		}
	}
	return nil
}

func (s *ChunkStats) add(o ChunkStats) {
	s.BytesMoved += o.BytesMoved
	s.ChunksMoved += o.ChunksMoved
	s.ZeroChunks += o.ZeroChunks
}
