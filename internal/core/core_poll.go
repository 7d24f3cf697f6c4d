package core

// PollRooms writes the status of rooms[i] into out[i], 0 (not a valid Poll)
// for a room with no live entry: one pass over the room table, allocating
// nothing. out must be at least as long as rooms.
func (c *Core) PollRooms(rooms []uint64, out []Poll) {
	out = out[:len(rooms)]
	for i, id := range rooms {
		out[i], _ = c.reg.Status(id)
	}
}
