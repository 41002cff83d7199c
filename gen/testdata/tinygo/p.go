// Package tinygo is the Go side of testdata/tiny: the type that implements
// its Plugin vtable (//kvcm:goimpl), and those its Ranker vtable's Go
// caller uses (//kvcm:gocaller, //kvcm:go).
package tinygo

import (
	"errors"
	"image"
)

// Plugin implements tiny's Plugin vtable.
type Plugin struct{ runs int }

// Run takes the pairs of the run slot.
func (p *Plugin) Run(pairs []image.Point) bool {
	p.runs += len(pairs)
	return p.runs > 0
}

// Probe fails until something ran.
func (p *Plugin) Probe() error {
	if p.runs == 0 {
		return errors.New("nothing ran")
	}
	return nil
}

// Destroy destroys.
func (p *Plugin) Destroy() {}

// Label is tiny's Label.
type Label struct{ Text string }

// Ranker calls tiny's Ranker vtable.
type Ranker struct {
	Rank    func(names []Label) ([]uint64, error)
	Destroy func()
}
