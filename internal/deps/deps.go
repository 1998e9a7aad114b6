package main
import (
 _ "github.com/spf13/cobra"
 _ "github.com/schollz/progressbar/v3"
 _ "github.com/dlclark/regexp2"
 _ "github.com/nlpodyssey/safetensors"
 _ "gonum.org/v1/gonum/mat"
 _ "github.com/pierrec/lz4/v4"
 _ "golang.org/x/sys/unix"
 _ "golang.org/x/text/unicode/norm"
)
func main(){}
