package codec

import "errors"

// ErrCorrupt is wrapped by every decoding error: the bytes are not a
// valid message or file of the format named in the error's text.
var ErrCorrupt = errors.New("codec: corrupt input")
