package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"
)

// sparseImage streams size bytes of zeros with dataMiB scattered 1 MiB regions of random
// data (seeded), without holding the image in memory.
type sparseImage struct {
	size, pos int64
	data      map[int64]bool // MiB index → has data
	rng       *rand.ChaCha8
}

func newSparseImage(size int64, dataMiB int, seed byte) *sparseImage {
	s := &sparseImage{size: size, data: map[int64]bool{}, rng: rand.NewChaCha8([32]byte{seed})}
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	for len(s.data) < dataMiB {
		s.data[r.Int64N(size>>20)] = true
	}
	return s
}

func (s *sparseImage) Read(p []byte) (int, error) {
	if s.pos >= s.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), s.size-s.pos, (s.pos>>20+1)<<20-s.pos))
	if s.data[s.pos>>20] {
		_, _ = s.rng.Read(p[:n])
	} else {
		clear(p[:n])
	}
	s.pos += int64(n)
	return n, nil
}

func openBucket(t *testing.T) *blob.Bucket {
	t.Helper()
	b, err := blob.OpenBucket(context.Background(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestSPOT4_SparseImageRoundTrip: a sparse 1 GiB image with 64 MiB of non-zero data round-trips
// through the chunk store with 64 MiB stored and fetched; zero chunks are neither (SPOT-4).
// The throughput is logged for docs/PERFORMANCE.md, not asserted.
func TestSPOT4_SparseImageRoundTrip(t *testing.T) {
	const size = 1 << 30
	ctx := context.Background()
	bucket := openBucket(t)
	src := sha256.New()
	start := time.Now()
	m, wst, err := WriteImage(ctx, bucket, "vm-1", io.TeeReader(newSparseImage(size, 64, 1), src), size, DefaultChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	writeTook := time.Since(start)
	if wst.BytesMoved != 64<<20 || wst.ChunksMoved != 64 || wst.ZeroChunks != 1024-64 || len(m.Chunks) != 1024 {
		t.Fatalf("write stats %+v (%d chunks): want 64 MiB in 64 chunks stored and 960 zero chunks skipped", wst, len(m.Chunks))
	}
	dst := sha256.New()
	start = time.Now()
	_, rst, err := ReadImage(ctx, bucket, "vm-1", dst)
	if err != nil {
		t.Fatal(err)
	}
	readTook := time.Since(start)
	if rst.BytesMoved != 64<<20 || rst.ZeroChunks != 960 {
		t.Fatalf("read stats %+v: want only the 64 MiB of data fetched", rst)
	}
	if string(src.Sum(nil)) != string(dst.Sum(nil)) {
		t.Fatal("the restored image differs from the original")
	}
	t.Logf("1 GiB sparse image, 64 MiB of data: stored %d MiB in %d chunks; write %.0f MiB/s of image (%.0f MiB/s stored), read %.0f MiB/s of image",
		wst.BytesMoved>>20, wst.ChunksMoved, 1024/writeTook.Seconds(), 64/writeTook.Seconds(), 1024/readTook.Seconds())
	// The same image again stores nothing new (content-addressed chunks).
	_, again, err := WriteImage(ctx, bucket, "vm-1-again", newSparseImage(size, 64, 1), size, DefaultChunkSize)
	if err != nil || again.BytesMoved != 0 {
		t.Fatalf("rewrite of the same image: %+v, %v; want nothing new stored", again, err)
	}
	if _, _, err := ReadImage(ctx, bucket, "nope", io.Discard); !errors.Is(err, ErrNoImage) {
		t.Fatalf("unknown image: %v", err)
	}
}

// TestSPOT4_DirImage: a checkpoint directory round-trips through the chunk store file by
// file, zero chunks skipped; deleting one sandbox's prefix removes its images and chunks and
// leaves another sandbox's untouched, even where their chunks are equal.
func TestSPOT4_DirImage(t *testing.T) {
	ctx := context.Background()
	bucket := openBucket(t)
	src := t.TempDir()
	sparse := make([]byte, 3*DefaultChunkSize+17)
	copy(sparse[DefaultChunkSize:], "non-zero chunk")
	files := map[string][]byte{"checkpoint.img": sparse, "tag": []byte("runsc 1")}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"sb-a", "sb-b"} {
		st, err := WriteDir(ctx, bucket, id+"/p1", src)
		if err != nil {
			t.Fatal(err)
		}
		if st.ZeroChunks != 3 || st.ChunksMoved != 2 {
			t.Fatalf("%s: stats %+v, want 3 zero chunks skipped (the zero tail too) and 2 stored (the data chunk, the tag)", id, st)
		}
	}
	dst := t.TempDir()
	if _, err := ReadDir(ctx, bucket, "sb-a/p1", dst); err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s restored as %d bytes, %v; want %d equal bytes", name, len(got), err, len(want))
		}
	}
	if err := DeletePrefix(ctx, bucket, "sb-a/"); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadDir(ctx, bucket, "sb-a/p1", t.TempDir()); !errors.Is(err, ErrNoImage) {
		t.Fatalf("deleted image reads as %v, want ErrNoImage", err)
	}
	if _, err := ReadDir(ctx, bucket, "sb-b/p1", t.TempDir()); err != nil {
		t.Fatalf("another sandbox's image after the delete: %v", err)
	}
}
