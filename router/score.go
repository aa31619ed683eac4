package router

import "github.com/cumulus-serving/cumulus/model"

// check is the version's own checks of req (model.Shape.CheckRequest):
// fields for a field-aware type, an FFM row's feature limit. It fills
// w.batch with req's inputs for score.
func (vr *versionRoute) check(w *work, req *Request) error {
	w.batch = model.Batch{RowSplits: req.RowSplits, Values: req.Values, SharedValues: req.SharedValues,
		Fields: req.Fields, SharedFields: req.SharedFields, Dense: req.Dense}
	if err := vr.shape.CheckRequest(&w.batch, len(req.IDs), len(req.SharedIDs)); err != nil {
		return invalid("model %q version %d: %v", vr.model, vr.version, err)
	}
	return nil
}

// score writes the score of each row into out, with the version's scorer,
// from the values w holds for the request's distinct ids.
func (vr *versionRoute) score(out []float32, w *work) {
	b := &w.batch
	b.Vals, b.Pos, b.SharedPos = w.vals, w.pos, w.sharedPos
	vr.scorer.Score(out, b, &w.scratch)
	*b = model.Batch{} // holds the request's inputs: let them go
}
