package loader

import (
	"errors"
	"syscall"
)

// isNotEmpty: renaming onto an existing non-empty directory fails with
// ENOTEMPTY or EEXIST depending on the system.
func isNotEmpty(err error) bool {
	return errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)
}
