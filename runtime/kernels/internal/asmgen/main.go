package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	out := flag.String("out", ".", "directory to write the .s files into")
	flag.Parse()
	files := map[string]func() string{
		"qdot8_amd64.s":    oneRowFile,
		"qdot8m_amd64.s":   multiRowFile,
		"qdot8p_amd64.s":   pairRowFile,
		"qdot8act_amd64.s": actFile,
	}
	for name, f := range files {
		if err := os.WriteFile(filepath.Join(*out, name), []byte(f()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "asmgen:", err)
			os.Exit(1)
		}
	}
}
