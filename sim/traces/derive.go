//go:build ignore

// Derive writes the Alibaba workload built into berth (sim.Alibaba) from the original trace
// files: go run sim/traces/derive.go -from DIR, where DIR holds
// alibaba-2023-openb-pod-list.csv and alibaba-2026-genai-pod-memory-util.csv.gz. See
// README.md beside it.
package main

import (
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/berth-dev/berth/sim"
)

func main() {
	from := flag.String("from", filepath.Join("..", "shared", "data"), "directory of the original Alibaba CSVs")
	to := flag.String("to", filepath.Join("sim", "traces"), "directory to write the derived files to")
	flag.Parse()
	// Read with the simulator's own loaders, so the copy holds what a run on the originals
	// would use: parsed, filtered, each container's samples in time order.
	pods, skipped, err := sim.LoadPods(filepath.Join(*from, "alibaba-2023-openb-pod-list.csv"))
	if err != nil {
		log.Fatal(err)
	}
	util, err := sim.LoadUtil(filepath.Join(*from, "alibaba-2026-genai-pod-memory-util.csv.gz"))
	if err != nil {
		log.Fatal(err)
	}
	samples := 0
	for _, s := range util {
		samples += len(s)
	}
	write(filepath.Join(*to, "alibaba-pods.csv.gz"), func(w io.Writer) error {
		fmt.Fprintln(w, "creation_time,deletion_time,memory_mib")
		for _, p := range pods {
			fmt.Fprintf(w, "%d,%d,%d\n", p.Arrival, p.Departure, p.MemoryMiB)
		}
		return nil
	})
	write(filepath.Join(*to, "alibaba-util.txt.gz"), func(w io.Writer) error {
		return sim.WriteSeries(w, fmt.Sprintf("Alibaba GenAI pod memory utilisation (resident / configured x %d), one container per line in container-id order, samples in time order", sim.SeriesScale), util)
	})
	log.Printf("%d pods (%d rows skipped), %d series of %d samples", len(pods), skipped, len(util), samples)
}

// write writes path through gzip at the best compression, with no name or time in the
// header, so the same input gives the same bytes.
func write(path string, body func(io.Writer) error) {
	f, err := os.Create(path)
	if err != nil {
		log.Fatal(err)
	}
	gz, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err := body(gz); err != nil {
		log.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		log.Fatal(err)
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
}
