//go:build !unix

package wire

import "syscall"

func (w *Writer) findPipe() {}

func tryWrite(syscall.RawConn, []byte) bool { return false }
