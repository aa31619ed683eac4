package codec

import (
	"bytes"
	"errors"
	"testing"
)

func TestMuxRoundTrip(t *testing.T) {
	body := []byte("lookup")
	b := AppendMuxCall(nil, MuxLookup, 1<<60+3, 1234567890123, body)
	kind, id, dl, got, err := ParseMuxCall(b)
	if err != nil || kind != MuxLookup || id != 1<<60+3 || dl != 1234567890123 || !bytes.Equal(got, body) {
		t.Fatalf("call: %v %v %v %q %v", kind, id, dl, got, err)
	}
	b = AppendMuxCall(nil, MuxCancel, 7, 0, nil)
	if kind, id, _, got, err := ParseMuxCall(b); err != nil || kind != MuxCancel || id != 7 || len(got) != 0 {
		t.Fatalf("cancel: %v %v %q %v", kind, id, got, err)
	}
	r := AppendMuxReply(nil, 9, 14, []byte("gone"))
	if id, code, msg, err := ParseMuxReply(r); err != nil || id != 9 || code != 14 || string(msg) != "gone" {
		t.Fatalf("reply: %v %v %q %v", id, code, msg, err)
	}
	for _, bad := range [][]byte{
		nil, make([]byte, 16),
		AppendMuxCall(nil, 3, 1, 0, nil),
		AppendMuxCall(nil, MuxCancel, 1, 0, []byte("x")),
		AppendMuxCall(nil, MuxLookup, 1, -5, nil),
	} {
		if _, _, _, _, err := ParseMuxCall(bad); !errors.Is(err, ErrMux) {
			t.Errorf("ParseMuxCall(%x) = %v", bad, err)
		}
	}
	for _, bad := range [][]byte{
		nil, make([]byte, 8),
		AppendMuxReply(nil, 1, 17, nil),
		AppendMuxReply(nil, 1, 2, make([]byte, MaxMuxMessage+1)),
	} {
		if _, _, _, err := ParseMuxReply(bad); !errors.Is(err, ErrMux) {
			t.Errorf("ParseMuxReply(%x) = %v", bad, err)
		}
	}
}

func FuzzParseMux(f *testing.F) {
	f.Add(AppendMuxCall(nil, MuxLookup, 1, 2, []byte("x")))
	f.Add(AppendMuxReply(nil, 1, 0, []byte("y")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if kind, id, dl, body, err := ParseMuxCall(b); err == nil {
			if again := AppendMuxCall(nil, kind, id, dl, body); !bytes.Equal(again, b) {
				t.Fatalf("call %x re-encodes as %x", b, again)
			}
		}
		if id, code, body, err := ParseMuxReply(b); err == nil {
			if again := AppendMuxReply(nil, id, code, body); !bytes.Equal(again, b) {
				t.Fatalf("reply %x re-encodes as %x", b, again)
			}
		}
	})
}
