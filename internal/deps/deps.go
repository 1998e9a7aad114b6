package main

import (
	_ "github.com/dlclark/regexp2"
	_ "github.com/nlpodyssey/safetensors"
	_ "github.com/pierrec/lz4/v4"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/spf13/cobra"
	_ "golang.org/x/sys/unix"
	_ "golang.org/x/text/unicode/norm"
	_ "gonum.org/v1/gonum/mat"
)

func main() {}
