//! RDMA devices: listing them and opening a [`Context`].

use std::ffi::CStr;
use std::ptr::NonNull;

use rdma_verbs_sys as sys;

use crate::device::context::Context;
use crate::error::{ret_ptr, Error, Result};
use crate::types::PortNumber;

/// The list of RDMA devices of this host.
///
/// # References
/// `ibv_get_device_list(3)`
#[doc(alias = "ibv_get_device_list")]
pub struct DeviceList {
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

// SAFETY: the list is an immutable array owned by this value; libibverbs'
// device objects are not tied to a thread.
unsafe impl Send for DeviceList {}
// SAFETY: only read access to the array and to immutable device fields.
unsafe impl Sync for DeviceList {}

/// Lists the RDMA devices. An empty list is not an error.
///
/// # Errors
/// [`Error::Verb`] when libibverbs cannot enumerate devices at all (e.g. the
/// kernel has no RDMA support: `ENOSYS`); [`Error::LibraryNotFound`] (feature
/// `dlopen`) when libibverbs is not installed.
///
/// # References
/// `ibv_get_device_list(3)`
#[doc(alias = "ibv_get_device_list")]
pub fn devices() -> Result<DeviceList> {
    // Every verbs object of this library starts here: `fork_init` must
    // not call `ibv_fork_init` from now on (see `fork.rs`).
    crate::device::library::ensure_loaded()?;
    crate::device::fork::note_verbs_start();
    let mut num = 0;
    // SAFETY: `num` is a valid out-pointer; the list is freed in Drop.
    let list = unsafe { sys::ibv_get_device_list(&mut num) };
    let list = ret_ptr("ibv_get_device_list", list)?;
    Ok(DeviceList {
        list,
        len: num.max(0) as usize,
    })
}

impl DeviceList {
    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no devices.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device at `index`.
    pub fn get(&self, index: usize) -> Option<Device<'_>> {
        (index < self.len).then(|| {
            // SAFETY: `index < len`, and the array holds `len` non-NULL pointers.
            let dev = unsafe { *self.list.as_ptr().add(index) };
            Device {
                dev: NonNull::new(dev).expect("libibverbs returned a NULL device"),
                _list: self,
            }
        })
    }

    /// Iterates over the devices.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Device<'_>> + '_ {
        (0..self.len).map(move |i| self.get(i).unwrap())
    }

    /// The device called `name` (e.g. `rxe0`, `mlx5_0`).
    pub fn find(&self, name: &str) -> Option<Device<'_>> {
        self.iter().find(|d| d.name() == name)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: freed once; contexts opened from it stay valid (ibv_free_device_list(3)).
        unsafe { sys::ibv_free_device_list(self.list.as_ptr()) };
    }
}

impl std::fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One device of a [`DeviceList`]; open it to use it.
#[derive(Clone, Copy)]
pub struct Device<'list> {
    dev: NonNull<sys::ibv_device>,
    _list: &'list DeviceList,
}

impl Device<'_> {
    /// The kernel name of the device (`rxe0`, `mlx5_0`).
    #[doc(alias = "ibv_get_device_name")]
    pub fn name(&self) -> &str {
        // SAFETY: the device is alive while the list is; the name is a
        // NUL-terminated array inside it.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(self.dev.as_ptr())) };
        name.to_str().unwrap_or("<non-utf8>")
    }

    /// The node GUID, in host byte order.
    #[doc(alias = "ibv_get_device_guid")]
    pub fn guid(&self) -> u64 {
        // SAFETY: valid device pointer.
        u64::from_be(unsafe { sys::ibv_get_device_guid(self.dev.as_ptr()) })
    }

    /// The sysfs path of the device (`/sys/class/infiniband/<name>`).
    pub fn ibdev_path(&self) -> &str {
        // SAFETY: `ibdev_path` is a NUL-terminated array of the live device.
        let path = unsafe { CStr::from_ptr((*self.dev.as_ptr()).ibdev_path.as_ptr()) };
        path.to_str().unwrap_or("")
    }

    /// Opens the device.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_open_device`.
    ///
    /// # References
    /// `ibv_open_device(3)`
    #[doc(alias = "ibv_open_device")]
    pub fn open(&self) -> Result<Context> {
        // SAFETY: valid device pointer; the context is closed in Context's Drop.
        let ctx = unsafe { sys::ibv_open_device(self.dev.as_ptr()) };
        let ctx = ret_ptr("ibv_open_device", ctx)?;
        Ok(Context::from_raw(ctx, self.name().to_owned()))
    }
}

impl std::fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name())
            .field("guid", &format_args!("{:#018x}", self.guid()))
            .finish()
    }
}

/// Opens the device called `name`.
///
/// # Errors
/// [`Error::NoDevice`] when no such device exists, else as [`Device::open`].
pub fn open_device(name: &str) -> Result<Context> {
    let list = devices()?;
    let dev = list.find(name).ok_or_else(|| Error::NoDevice {
        name: Some(name.to_string()),
    })?;
    dev.open()
}

/// Opens the device called `name` and finds its first active port; without
/// a name, the first device that has an active port (in `devices()`'s
/// order). What `ibv_rc_pingpong` and perftest do with `-d`, and without it.
///
/// # Errors
/// [`Error::NoDevice`] when no device is called `name`, or without a name
/// when no device has an active port; [`Error::NoActivePort`] when the named
/// device has none; else as [`devices`], [`Device::open`] and
/// [`Context::active_port`].
pub fn open_active(name: Option<&str>) -> Result<(Context, PortNumber)> {
    if let Some(name) = name {
        let ctx = open_device(name)?;
        let port = ctx.active_port()?;
        return Ok((ctx, port));
    }
    let list = devices()?;
    for dev in list.iter() {
        let ctx = dev.open()?;
        if let Ok(port) = ctx.active_port() {
            return Ok((ctx, port));
        }
    }
    Err(Error::NoDevice { name: None })
}
